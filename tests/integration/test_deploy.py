"""deploy/: the container image, the Kubernetes manifests and the Argo sweep template.

- Every Kubernetes manifest validates, strictly (no unknown field), against Kubernetes'
  own OpenAPI schemas for the oldest and the newest version kubernetes-validate ships.
- The things that matter for a benchmark are checked by name: the Indexed Job's
  completions, parallelism and worker count agree, no pod restarts or retries, pods run as
  non-root with whole CPUs, every $(VAR) in args is declared, the merge reads where the
  workers write.
- The Argo WorkflowTemplate has what Argo requires, every template it calls exists,
  every parameter it uses is declared, its reconfigure step patches a KServe
  InferenceService and waits for it (run against a recording kubectl), its results are S3
  artifacts of the repository it names, and its collect script tables the sweeps.
- No image is `latest` or untagged; the loadgen image's tag is the package's version.
- The Dockerfile has a builder and a compiler-free runtime stage that both run
  scripts/build_image.sh, a non-root USER and `python -m loadgen` as its ENTRYPOINT; the
  script builds a wheel whose installed package has the native HTTP and gRPC clients
  (`loadgen env --json`), into a fresh virtual environment; the image is built when a
  Docker daemon is reachable.
- The package's metadata: license (and the LICENSE file), author, project URLs, and the
  small packages a plain install has by default.
- The loadgen command lines the manifests run use flags and LOADGEN_* variables that the
  real CLI has, and the one-pod and scale-out Jobs run locally, as written, against the
  demo SUT.
"""

import csv
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import kubernetes_validate  # the test extra: pip install '.[test]'
import pytest
import yaml  # PyYAML, a dependency of kubernetes-validate
from kubernetes_validate.utils import all_versions
from packaging.version import Version

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy")
K8S = os.path.join(DEPLOY, "k8s")
ARGO_TEMPLATE = os.path.join(DEPLOY, "argo", "sweep-workflowtemplate.yaml")
DOCKERFILE = os.path.join(DEPLOY, "Dockerfile")
BUILD_SCRIPT = os.path.join(ROOT, "scripts", "build_image.sh")
ARTIFACT_REPOSITORY = os.path.join(DEPLOY, "argo", "artifact-repository.yaml")
GUIDE = os.path.join(ROOT, "docs", "kubernetes.md")

pytestmark = pytest.mark.skipif(not os.path.isdir(DEPLOY), reason="needs the source tree (deploy/)")

# The oldest Kubernetes the manifests are for (the Indexed Job's backoffLimitPerIndex is
# on by default since 1.29), or the oldest whose schemas this kubernetes-validate still
# ships, and the newest it ships.
K8S_VERSIONS = (str(max(Version("1.29.0"), Version(all_versions()[0]))), kubernetes_validate.latest_version())
PLACEHOLDER = "@START_AT@"
_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _manifest_files():
    found = []
    for folder, _, names in os.walk(DEPLOY):
        found += [os.path.join(folder, n) for n in names if n.endswith((".yaml", ".yml"))]
    return sorted(found)


def _load_all(path):
    with open(path, encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def _load_one(path):
    docs = _load_all(path)
    assert len(docs) == 1, f"{path}: expected one document, found {len(docs)}"
    return docs[0]


def _kubernetes_docs():
    return [(os.path.relpath(p, ROOT), i, doc)
            for p in _manifest_files()
            for i, doc in enumerate(_load_all(p))
            if not str(doc.get("apiVersion", "")).startswith("argoproj.io/")]


def _pod_spec(doc):
    if doc["kind"] == "Pod":
        return doc["spec"]
    assert doc["kind"] == "Job", doc["kind"]
    return doc["spec"]["template"]["spec"]


def _env(container):
    """The container's env as a dict; valueFrom entries map to their fieldRef path."""
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
        else:
            env[item["name"]] = item["valueFrom"]["fieldRef"]["fieldPath"]
    return env


def _pods():
    """(file, pod spec) for every workload under deploy/k8s."""
    out = []
    for name in sorted(os.listdir(K8S)):
        for doc in _load_all(os.path.join(K8S, name)):
            if doc["kind"] in ("Job", "Pod"):
                out.append((name, _pod_spec(doc)))
    return out


# ----------------------------------------------------------------- Kubernetes schemas

def test_there_are_manifests_to_check():
    names = {os.path.relpath(p, ROOT) for p in _manifest_files()}
    for expected in ("deploy/k8s/job.yaml", "deploy/k8s/indexed-job.yaml", "deploy/k8s/merge-job.yaml",
                     "deploy/k8s/results-pvc.yaml", "deploy/argo/sweep-workflowtemplate.yaml",
                     "deploy/argo/artifact-repository.yaml"):
        assert expected in names


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_kubernetes_manifest_validates_against_the_kubernetes_schemas(version):
    docs = _kubernetes_docs()
    assert len(docs) >= 5
    for path, index, doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{path} (document {index}, {doc['kind']}) against Kubernetes {version}: "
                        f"{'.'.join(map(str, e.path))}: {e.message}")


def test_the_placeholder_substituted_manifests_still_validate():
    """What `sed s/@START_AT@/<epoch>/g ... | kubectl apply -f -` submits."""
    for name in ("indexed-job.yaml", "merge-job.yaml"):
        with open(os.path.join(K8S, name), encoding="utf-8") as f:
            text = f.read()
        assert PLACEHOLDER in text, f"{name} has no {PLACEHOLDER} placeholder"
        doc = yaml.safe_load(text.replace(PLACEHOLDER, "1700000000"))
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


# ---------------------------------------------------------- what matters for a benchmark

def test_every_job_runs_once_and_gets_time_to_write_its_result_on_sigterm():
    for name in sorted(os.listdir(K8S)):
        for doc in _load_all(os.path.join(K8S, name)):
            if doc["kind"] != "Job":
                continue
            if doc["spec"].get("completionMode") == "Indexed":
                # Per worker: a failed worker must not stop the others mid-run.
                assert doc["spec"]["backoffLimitPerIndex"] == 0, name
                assert "backoffLimit" not in doc["spec"] and "maxFailedIndexes" not in doc["spec"], name
            else:
                assert doc["spec"]["backoffLimit"] == 0, name
            pod = doc["spec"]["template"]["spec"]
            assert pod["restartPolicy"] == "Never", name
            grace_s = float(_env(pod["containers"][0]).get("LOADGEN_GRACE_S", 10))
            # The run waits --grace-s for outstanding queries, then writes its files.
            assert pod["terminationGracePeriodSeconds"] >= grace_s + 15, name


def test_every_pod_runs_as_non_root_with_resources_and_no_privilege():
    pods = _pods()
    assert len(pods) >= 4
    for name, pod in pods:
        security = pod["securityContext"]
        assert security["runAsNonRoot"] is True, name
        assert security.get("runAsUser", 10001) != 0, name
        for container in pod["containers"]:
            resources = container["resources"]
            assert resources["requests"] and resources["limits"], name
            assert container["securityContext"]["allowPrivilegeEscalation"] is False, name
            assert "ALL" in container["securityContext"]["capabilities"]["drop"], name


def test_load_generating_pods_get_whole_dedicated_cpus():
    """requests == limits with an integer CPU count: Guaranteed QoS, which a static CPU
    manager turns into exclusive cores for the issue thread and the dispatcher."""
    for name in ("job.yaml", "indexed-job.yaml"):
        container = _pod_spec(_load_one(os.path.join(K8S, name)))["containers"][0]
        requests, limits = container["resources"]["requests"], container["resources"]["limits"]
        assert requests == limits, name
        assert re.fullmatch(r"[1-9][0-9]*", str(requests["cpu"])) and int(requests["cpu"]) >= 2, name


def test_every_var_reference_in_args_is_declared_in_the_container_env():
    """Kubernetes expands $(NAME) in command and args only for variables declared in the
    container's env; any other reference is passed on literally."""
    for name, pod in _pods():
        for container in pod["containers"]:
            env = _env(container)
            for arg in container.get("command", []) + container.get("args", []):
                for ref in _VAR_REF.findall(arg):
                    assert ref in env, f"{name}: $({ref}) is not declared in the env of {container['name']}"


def test_the_indexed_job_runs_n_workers_at_once_with_the_worker_contract():
    job = _load_one(os.path.join(K8S, "indexed-job.yaml"))
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    n = spec["completions"]
    assert n >= 2 and spec["parallelism"] == n, "every worker must run at the same time"
    container = spec["template"]["spec"]["containers"][0]
    env, args = _env(container), container["args"]
    assert args[0] == "run"
    assert env["LOADGEN_WORKERS"] == str(n)
    assert "--workers=$(LOADGEN_WORKERS)" in args
    assert "--worker-index=$(JOB_COMPLETION_INDEX)" in args
    assert env["JOB_COMPLETION_INDEX"] == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert env["LOADGEN_START_AT"] == PLACEHOLDER
    assert "--output=$(RUN_DIR)/worker-$(JOB_COMPLETION_INDEX)" in args
    assert env["RUN_DIR"].startswith("/results/")
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
    assert volumes[mounts["/results"]]["persistentVolumeClaim"]["claimName"] == "loadgen-results"


def test_the_merge_job_merges_every_worker_from_where_the_workers_wrote():
    workers = _load_one(os.path.join(K8S, "indexed-job.yaml"))
    merge = _load_one(os.path.join(K8S, "merge-job.yaml"))
    worker_env = _env(workers["spec"]["template"]["spec"]["containers"][0])
    container = merge["spec"]["template"]["spec"]["containers"][0]
    env = _env(container)
    assert env["WORKERS"] == str(workers["spec"]["completions"])
    assert env["RUN_DIR"] == worker_env["RUN_DIR"]
    script = container["command"][-1]
    assert container["command"][:2] == ["sh", "-c"]
    assert '"$RUN_DIR/worker-$i"' in script or "$RUN_DIR/worker-$i" in script
    assert 'python -m loadgen merge $paths --output "$RUN_DIR/merged"' in script
    claims = {v["persistentVolumeClaim"]["claimName"] for v in merge["spec"]["template"]["spec"]["volumes"]
              if "persistentVolumeClaim" in v}
    assert claims == {"loadgen-results"}


def test_the_results_claim_is_shared_read_write_many():
    pvc = _load_one(os.path.join(K8S, "results-pvc.yaml"))
    assert pvc["kind"] == "PersistentVolumeClaim" and pvc["metadata"]["name"] == "loadgen-results"
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]


# ------------------------------------------------------------------------------ Argo

_ARGO_TYPES = ("container", "script", "steps", "dag", "resource", "suspend", "containerSet", "data", "http",
               "plugin")
_EXPRESSION = re.compile(r"{{\s*([^{}]+?)\s*}}")


def _strings(node, path=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _strings(value, f"{path}[{i}]")
    elif isinstance(node, str):
        yield path, node


def _steps(template):
    for group in template.get("steps") or []:
        yield from group
    yield from (template.get("dag") or {}).get("tasks", [])


def test_the_argo_template_has_the_fields_argo_requires():
    wft = _load_one(ARGO_TEMPLATE)
    assert wft["apiVersion"] == "argoproj.io/v1alpha1" and wft["kind"] == "WorkflowTemplate"
    assert wft["metadata"]["name"]
    spec = wft["spec"]
    names = [t["name"] for t in spec["templates"]]
    assert len(names) == len(set(names)), "template names must be unique"
    assert spec["entrypoint"] in names
    for template in spec["templates"]:
        kinds = [k for k in _ARGO_TYPES if k in template]
        assert len(kinds) == 1, f"template {template['name']}: exactly one of {_ARGO_TYPES}, found {kinds}"
        if "container" in template or "script" in template:
            assert (template.get("container") or template.get("script"))["image"]


def test_every_argo_template_called_exists_and_loops_have_items():
    wft = _load_one(ARGO_TEMPLATE)
    templates = {t["name"]: t for t in wft["spec"]["templates"]}
    called = set()
    for template in templates.values():
        for step in _steps(template):
            assert step["template"] in templates, f"{template['name']}: step {step['name']} calls a missing template"
            called.add(step["template"])
            uses_item = any("{{item" in s for _, s in _strings(step.get("arguments", {})))
            assert not uses_item or "withParam" in step or "withItems" in step, step["name"]
    assert set(templates) - {wft["spec"]["entrypoint"]} <= called, "a template is never called"
    # The fan-out over server configurations, one at a time (they reconfigure one server).
    grid = templates[wft["spec"]["entrypoint"]]
    assert grid["parallelism"] == 1
    assert any(s.get("withParam") == "{{workflow.parameters.server-configs}}" for s in _steps(grid))


def test_every_argo_parameter_used_is_declared():
    wft = _load_one(ARGO_TEMPLATE)
    spec = wft["spec"]
    workflow_params = {p["name"] for p in spec["arguments"]["parameters"]}
    for p in spec["arguments"]["parameters"]:
        assert "value" in p, f"workflow parameter {p['name']} has no default"
    templates = {t["name"]: t for t in spec["templates"]}
    checked = 0
    for where, text in _strings({k: v for k, v in spec.items() if k != "templates"}):
        for expr in _EXPRESSION.findall(text):
            assert not expr.startswith("inputs."), f"spec{where}: {expr} outside a template"
            if expr.startswith("workflow.parameters."):
                assert expr.split(".", 2)[2] in workflow_params, f"spec{where}: {expr}"
    for template in templates.values():
        declared = {p["name"] for p in (template.get("inputs") or {}).get("parameters", [])}
        for where, text in _strings(template):
            for expr in _EXPRESSION.findall(text):
                checked += 1
                if expr.startswith("inputs.parameters."):
                    assert expr.split(".", 2)[2] in declared, f"template {template['name']}{where}: {expr}"
                elif expr.startswith("workflow.parameters."):
                    assert expr.split(".", 2)[2] in workflow_params, f"template {template['name']}{where}: {expr}"
                else:
                    assert expr == "workflow.name" or expr.startswith("item"), (
                        f"template {template['name']}{where}: unexpected {{{{{expr}}}}}")
        # Every argument a step passes is an input the called template declares, and
        # every input without a default is passed.
        for step in _steps(template):
            target = templates[step["template"]]
            inputs = (target.get("inputs") or {}).get("parameters", [])
            passed = {p["name"] for p in (step.get("arguments") or {}).get("parameters", [])}
            assert passed <= {p["name"] for p in inputs}, step["name"]
            assert {p["name"] for p in inputs if "value" not in p and "default" not in p} <= passed, step["name"]
    assert checked > 10


def test_the_default_server_configs_are_a_json_list_of_complete_configs():
    wft = _load_one(ARGO_TEMPLATE)
    params = {p["name"]: p["value"] for p in wft["spec"]["arguments"]["parameters"]}
    configs = json.loads(params["server-configs"])
    assert isinstance(configs, list) and configs
    for config in configs:
        assert set(config) == {"name", "predictor"}, config
        assert isinstance(config["predictor"], dict), config
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", config["name"]), config


def test_the_argo_collect_step_tables_every_sweep_and_fails_on_a_missing_one(tmp_path):
    wft = _load_one(ARGO_TEMPLATE)
    collect = {t["name"]: t for t in wft["spec"]["templates"]}["collect"]["script"]
    assert collect["command"] == ["python"]
    configs = [{"name": "a", "predictor": {}}, {"name": "b", "predictor": {"minReplicas": 2}}]
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "sweep.csv").write_text("target_qps,p99_ms,config\n100,2.5,a\n200,3.5,a\n")
    env = {**_clean_env(), "RUN_DIR": str(tmp_path), "CONFIGS": json.dumps(configs)}

    def collect_now():
        return subprocess.run([sys.executable, "-c", collect["source"]], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)

    done = collect_now()
    assert done.returncode == 1 and "no sweep.csv for: b" in done.stderr, done.stderr
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "sweep.csv").write_text("target_qps,p99_ms,valid\n100,1.5,true\n")
    done = collect_now()
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "grid.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["config"], r["target_qps"]) for r in rows] == [("a", "100"), ("a", "200"), ("b", "100")]
    assert rows[2]["valid"] == "true" and rows[0]["valid"] == ""


def test_the_argo_pods_use_the_results_claim_and_a_service_account():
    wft = _load_one(ARGO_TEMPLATE)
    spec = wft["spec"]
    assert spec["serviceAccountName"] == "loadgen-sweep"
    assert spec["securityContext"]["runAsNonRoot"] is True
    (volume,) = spec["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == "{{workflow.parameters.results-pvc}}"
    rbac = {doc["kind"]: doc for doc in _load_all(os.path.join(DEPLOY, "argo", "rbac.yaml"))}
    assert rbac["ServiceAccount"]["metadata"]["name"] == spec["serviceAccountName"]
    assert rbac["RoleBinding"]["subjects"][0]["name"] == spec["serviceAccountName"]


def test_the_service_account_patches_inference_services_and_not_their_deployments():
    """KServe's controller owns the Deployment behind an InferenceService and reverts edits there."""
    role = {doc["kind"]: doc for doc in _load_all(os.path.join(DEPLOY, "argo", "rbac.yaml"))}["Role"]
    granted = {(group, resource): set(rule["verbs"])
               for rule in role["rules"] for group in rule["apiGroups"] for resource in rule["resources"]}
    assert {"get", "watch", "patch"} <= granted[("serving.kserve.io", "inferenceservices")]
    assert not [key for key in granted if key[0] == "apps"], granted


def _reconfigure(tmp_path, predictor, generation="7"):
    """Runs the reconfigure step's script as the pod would, with a kubectl that records its
    arguments (one JSON list a line) and answers `get` with the generation."""
    wft = _load_one(ARGO_TEMPLATE)
    container = {t["name"]: t for t in wft["spec"]["templates"]}["reconfigure"]["container"]
    assert container["command"] == ["sh", "-c"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "kubectl.log"
    (bin_dir / "kubectl").write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"if sys.argv[1] == 'get':\n    print({generation!r}, end='')\n")
    (bin_dir / "kubectl").chmod(0o755)
    params = {"workflow.parameters.inferenceservice": "my-model", "inputs.parameters.predictor": json.dumps(predictor)}
    env = {item["name"]: _EXPRESSION.sub(lambda m: params[m.group(1)], item["value"]) for item in container["env"]}
    env["PATH"] = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    done = subprocess.run(["sh", "-c", container["args"][0]], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_the_reconfigure_step_patches_the_inference_service_and_waits_for_its_new_spec_to_be_ready(tmp_path):
    predictor = {"minReplicas": 2, "maxReplicas": 2,
                 "model": {"env": [{"name": "MAX_BATCH_SIZE", "value": "8"}, {"name": "NOTE", "value": "a \"b\" $c"}]}}
    calls = _reconfigure(tmp_path, predictor)
    patch, get, *waits = calls
    assert patch[:2] == ["patch", "inferenceservice/my-model"] and "--type=merge" in patch
    assert json.loads(patch[patch.index("-p") + 1]) == {"spec": {"predictor": predictor}}
    assert get[:2] == ["get", "inferenceservice/my-model"]
    # Ready only once the controller has seen this spec: not the old revision's Ready.
    assert waits[0] == ["wait", "inferenceservice/my-model", "--for=jsonpath={.status.observedGeneration}=7",
                        "--timeout=5m"]
    assert waits[-1][:3] == ["wait", "inferenceservice/my-model", "--for=condition=Ready"]
    assert not any("deployment" in arg for call in calls for arg in call)


def test_the_sweeps_and_the_grid_are_uploaded_as_s3_artifacts_of_the_named_repository():
    wft = _load_one(ARGO_TEMPLATE)
    spec = wft["spec"]
    templates = {t["name"]: t for t in spec["templates"]}
    # The repository the artifacts go to: a ConfigMap of S3 settings, credentials in a Secret.
    ref = spec["artifactRepositoryRef"]
    repository = _load_one(ARTIFACT_REPOSITORY)
    assert repository["kind"] == "ConfigMap" and repository["metadata"]["name"] == ref["configMap"]
    s3 = yaml.safe_load(repository["data"][ref["key"]])["s3"]
    assert s3["bucket"] and s3["endpoint"]
    assert s3["accessKeySecret"]["name"] == s3["secretKeySecret"]["name"] == "loadgen-s3"
    # Each sweep's folder, where its --output wrote it.
    sweep = templates["sweep"]
    output = next(a for a in sweep["container"]["args"] if a.startswith("--output="))[len("--output="):]
    (folder,) = sweep["outputs"]["artifacts"]
    assert folder["path"] == output
    assert any(folder["path"].startswith(m["mountPath"] + "/") for m in sweep["container"]["volumeMounts"])
    assert folder["s3"]["key"] == "{{workflow.name}}/{{inputs.parameters.config}}.tgz"
    assert folder["optional"] is True, "a sweep that wrote nothing must not hide the step's own outcome"
    # The grid, as a plain file.
    (grid,) = templates["collect"]["outputs"]["artifacts"]
    assert grid["path"] == "/results/{{workflow.name}}/grid.csv" and grid["archive"] == {"none": {}}
    assert grid["s3"]["key"] == "{{workflow.name}}/grid.csv"


# --------------------------------------------------------------------------- images

_TAG = re.compile(r"^(?P<name>[^@]+?)(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@sha256:[0-9a-f]{64})?$")


def _image_problem(image):
    """Why an image reference is not pinned (None when it is): no tag, or `latest`."""
    match = _TAG.match(image)
    if match is None or "/" in (match.group("tag") or ""):
        return f"{image!r} is not an image reference"
    if "@sha256:" in image:
        return None
    if match.group("tag") is None:
        return f"{image} has no tag (that is `latest`)"
    if match.group("tag") == "latest":
        return f"{image} is `latest`"
    return None


def _deploy_images():
    """(where, image) of every image the manifests and the Argo template's defaults name."""
    found = []
    for path in _manifest_files():
        for doc in _load_all(path):
            where = os.path.relpath(path, ROOT)
            for key_path, value in _strings(doc):
                if key_path.endswith(".image") and "{{" not in value:
                    found.append((where, value))
            if doc.get("kind") == "WorkflowTemplate":
                for p in doc["spec"]["arguments"]["parameters"]:
                    if p["name"].endswith("image"):
                        found.append((f"{where} parameter {p['name']}", p["value"]))
    return found


def _dockerfile_images():
    args, images = {}, []
    for instruction, rest in _dockerfile_instructions():
        if instruction == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            args[name.strip()] = value.strip()
        elif instruction == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            images.append(re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), words[0]))
    return images


def test_the_image_reference_check_tells_pinned_from_floating():
    for ok in ("python:3.11.14-slim-bookworm", "alpine/k8s:1.33.4", "registry.example.com:5000/loadgen:0.1.0",
               "python@sha256:" + "a" * 64, "python:3.11@sha256:" + "b" * 64):
        assert _image_problem(ok) is None, ok
    for bad in ("python", "bitnami/kubectl:latest", "registry.example.com:5000/loadgen", "loadgen:latest"):
        assert _image_problem(bad), bad


def test_no_manifest_or_dockerfile_uses_latest_or_an_untagged_image():
    images = _deploy_images()
    assert {where.split(" ")[0] for where, _ in images} >= {
        "deploy/k8s/job.yaml", "deploy/k8s/indexed-job.yaml", "deploy/argo/sweep-workflowtemplate.yaml"}
    problems = [f"{where}: {why}" for where, image in images if (why := _image_problem(image))]
    froms = _dockerfile_images()
    stage_names = {rest.split()[-1] for i, rest in _dockerfile_instructions() if i == "FROM" and " AS " in rest.upper()}
    for image in froms:
        if image not in stage_names:
            problems += [f"deploy/Dockerfile FROM: {why}" for why in [_image_problem(image)] if why]
    assert not problems, problems
    # The Python base: a patch release on a named Debian release.
    assert all(re.fullmatch(r"python:3\.\d+\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", i) for i in froms), froms


def test_the_loadgen_image_is_tagged_with_the_package_version():
    from loadgen._version import __version__

    loadgen_images = [(where, image) for where, image in _deploy_images()
                      if image.rsplit("/", 1)[-1].split(":")[0] == "loadgen"]
    assert len(loadgen_images) >= 5, loadgen_images
    for where, image in loadgen_images:
        assert image == f"loadgen:{__version__}", f"{where}: {image}"
    with open(DOCKERFILE, encoding="utf-8") as f:
        assert f"-t loadgen:{__version__} ." in f.read()


# -------------------------------------------------------------------------- Dockerfile

def _dockerfile_instructions():
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    with open(DOCKERFILE, encoding="utf-8") as f:
        lines = f.read().splitlines()
    out, pending = [], ""
    for line in lines:
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends in a continuation"
    return out


def _stages():
    stages = []
    for instruction, rest in _dockerfile_instructions():
        if instruction == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instruction, rest))
    return stages


def _script_branches():
    """scripts/build_image.sh's build and install parts, the text of each `if` block."""
    with open(BUILD_SCRIPT, encoding="utf-8") as f:
        text = f.read()
    build = text[text.index('if [ "$build" = 1 ]; then'):]
    install = text[text.index('if [ "$install" = 1 ]; then'):]
    return build[:build.index("\nfi\n")], install[:install.index("\nfi\n")]


_COMPILER = re.compile(r"(build-essential|\bgcc\b|\bg\+\+|\bclang\b|-dev\b)")


def test_the_dockerfile_builds_in_one_stage_and_runs_in_another_without_a_compiler():
    """Both stages run scripts/build_image.sh, the one set of build steps: the builder its
    build part (compiler, headers, the wheel with nghttp2), the runtime its install part."""
    stages = _stages()
    assert len(stages) >= 2
    builder, runtime = stages[0], stages[-1]
    builder_runs = [rest for i, rest in builder if i == "RUN"]
    assert any(re.search(r"scripts/build_image\.sh --build-only\b", rest) for rest in builder_runs), builder_runs
    for instruction, rest in runtime:
        if instruction == "RUN":
            assert not _COMPILER.search(rest), rest
    assert any(i == "COPY" and "--from=builder" in rest for i, rest in runtime)
    installs = " ".join(rest for i, rest in runtime if i == "RUN")
    assert re.search(r"build_image\.sh --install-only .*--extras grpc\b", installs), installs
    build, install = _script_branches()
    assert "g++" in build and "zlib1g-dev" in build and "libnghttp2-dev" in build and "libssl-dev" in build
    assert "LOADGEN_NGHTTP2=1" in build and "LOADGEN_OPENSSL=1" in build and "pip wheel --no-deps" in build
    # The runtime part installs nghttp2's and OpenSSL's shared libraries and nothing to compile with.
    assert "libnghttp2-14" in install and "libssl3" in install and not _COMPILER.search(install), install


def test_the_image_runs_loadgen_as_a_numeric_non_root_user():
    runtime = _stages()[-1]
    users = [rest for instruction, rest in runtime if instruction == "USER"]
    assert users, "the runtime stage has no USER"
    user = users[-1].split(":")[0]
    assert user.isdigit() and int(user) != 0, f"USER {users[-1]}: runAsNonRoot needs a numeric, non-zero UID"
    entrypoint = [json.loads(rest) for instruction, rest in runtime if instruction == "ENTRYPOINT"]
    assert entrypoint[-1] == ["python", "-m", "loadgen"]
    cmd = [json.loads(rest) for instruction, rest in runtime if instruction == "CMD"]
    assert cmd[-1] == ["run"]
    workdir = [rest for instruction, rest in runtime if instruction == "WORKDIR"]
    assert workdir[-1] == "/results"
    # The manifests run as the image's user.
    for name, pod in _pods():
        assert pod["securityContext"]["runAsUser"] == int(user), name


def test_the_build_context_leaves_out_build_outputs():
    with open(os.path.join(ROOT, ".dockerignore"), encoding="utf-8") as f:
        patterns = {line.strip() for line in f if line.strip() and not line.startswith("#")}
    for needed in (".git", "build/", "**/*.so", ".servers/"):
        assert needed in patterns, needed


def _docker_ready():
    docker = shutil.which("docker")
    if docker is None:
        return None, "docker is not installed"
    try:
        info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"docker info failed: {e}"
    if info.returncode != 0:
        return None, "no Docker daemon is reachable (docker info failed)"
    return docker, ""


@pytest.mark.integration
def test_the_image_builds_and_runs_the_demo_benchmark():
    docker, why = _docker_ready()
    if docker is None:
        pytest.skip(f"image build not run: {why}")
    tag = "loadgen-test-deploy:build"
    build = subprocess.run([docker, "build", "-f", DOCKERFILE, "-t", tag, ROOT],
                           capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    try:
        who = subprocess.run([docker, "run", "--rm", "--entrypoint", "id", tag, "-u"],
                             capture_output=True, text=True, timeout=60)
        assert who.stdout.strip() == "10001", who.stdout + who.stderr
        compiler = subprocess.run([docker, "run", "--rm", "--entrypoint", "sh", tag, "-c",
                                   "command -v gcc g++ cc c++ || true"],
                                  capture_output=True, text=True, timeout=60)
        assert compiler.stdout.strip() == "", f"compilers in the runtime image: {compiler.stdout}"
        run = subprocess.run([docker, "run", "--rm", tag, "run", "--duration-s", "1", "--target-qps", "100"],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode in (0, 1), run.stdout + run.stderr
        assert re.match(r"(VALID|INVALID)\b", run.stdout), run.stdout
    finally:
        subprocess.run([docker, "image", "rm", "-f", tag], capture_output=True, timeout=60)


def test_the_build_script_refuses_a_bad_argument_with_a_one_line_reason(tmp_path):
    for argv, reason in ((["--bogus"], "unknown argument: --bogus"), (["--venv"], "--venv needs a value"),
                         (["--build-only", "--install-only"], "exclude each other")):
        done = subprocess.run(["bash", BUILD_SCRIPT, *argv], capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert done.returncode == 2, (argv, done.stderr)
        assert reason in done.stderr and len(done.stderr.strip().splitlines()) == 1, (argv, done.stderr)
    assert not (tmp_path / "dist").exists()


def _venv_python(venv):
    return str(venv / "bin" / "python")


@pytest.mark.integration
def test_the_build_script_installs_a_wheel_with_the_native_clients_into_a_fresh_venv(tmp_path):
    """scripts/build_image.sh as the image and CI run it, into a new virtual environment:
    the installed package (not this source tree) reports both native clients and their TLS, and has its
    metadata and its default dependencies. The build reuses the in-tree objects a
    `pip install .` left (CI's); LOADGEN_WHEEL_DIR, a folder holding a wheel this script
    built, installs that wheel instead of building again."""
    venv = tmp_path / "venv"
    prebuilt = os.environ.get("LOADGEN_WHEEL_DIR")
    if prebuilt:
        argv = ["--install-only", "--wheel-dir", prebuilt]
    else:
        argv = ["--wheel-dir", str(tmp_path / "wheels")]
    env = _clean_env()
    env["PYTHON"] = sys.executable
    try:
        done = subprocess.run(["bash", BUILD_SCRIPT, *argv, "--venv", str(venv)], capture_output=True, text=True,
                              timeout=1800, cwd=tmp_path, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"scripts/build_image.sh took over 30 minutes: {str(e.stdout)[-2000:]}")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    if not prebuilt:
        assert len(list((tmp_path / "wheels").glob("loadgen-*.whl"))) == 1
    python = _venv_python(venv)
    report = subprocess.run([python, "-m", "loadgen", "env", "--json"], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path, env=_clean_env())
    assert report.returncode == 0, report.stderr
    rep = json.loads(report.stdout)
    assert rep["native_clients"]["http"] is True
    assert rep["native_clients"]["grpc"] is True and rep["native_clients"]["nghttp2"], rep["native_clients"]
    assert rep["native_clients"]["tls"] is True and rep["native_clients"]["openssl"], rep["native_clients"]
    # nvidia-ml-py is there by default: no GPU here is NVML's own answer, never "not installed".
    assert "not installed" not in (rep["topology"]["gpu_note"] or ""), rep["topology"]["gpu_note"]
    probe = subprocess.run([python, "-c", """
import importlib.metadata as m, importlib.util, json, loadgen, loadgen._core
meta = m.metadata("loadgen")
print(json.dumps({"where": [loadgen.__file__, loadgen._core.__file__],
                  "license": meta["License-Expression"], "author": meta["Author"], "home": meta["Home-page"],
                  "license_files": meta.get_all("License-File"), "urls": meta.get_all("Project-URL"),
                  "files": [str(f) for f in m.files("loadgen") if f.name == "LICENSE"],
                  "pynvml": importlib.util.find_spec("pynvml") is not None,
                  "uvloop": importlib.util.find_spec("uvloop") is not None,
                  "grpc": importlib.util.find_spec("grpc") is not None}))
"""], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_clean_env())
    assert probe.returncode == 0, probe.stderr
    got = json.loads(probe.stdout)
    for where in got["where"]:
        assert where.startswith(str(venv)), f"{where} is not the installed package"
    assert got["license"] == "Apache-2.0" and got["author"] == "loadgen authors"
    assert got["license_files"] == ["LICENSE"] and got["files"], got
    assert any(u.startswith("Homepage, https://") for u in got["urls"]), got["urls"]
    assert got["home"] == got["urls"][0].split(", ", 1)[1], "pip show before pip 25 reads Home-page only"
    assert got["pynvml"] and got["uvloop"], "nvidia-ml-py and uvloop are default dependencies on Linux"
    assert got["grpc"], "the script installs the grpc extra by default"


# ------------------------------------------------------------------------ packaging

def _pyproject():
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _requirement_names(requirements):
    from packaging.requirements import Requirement

    return {Requirement(r).name.lower(): Requirement(r) for r in requirements}


def test_the_package_metadata_names_its_license_author_and_home():
    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    with open(os.path.join(ROOT, "LICENSE"), encoding="utf-8") as f:
        text = f.read()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text) > 10000, "the full license text"
    assert project["authors"] == [{"name": "loadgen authors"}]
    assert project["urls"]["Homepage"].startswith("https://")
    # SPDX license expressions need setuptools 77 or later to build.
    requires = _requirement_names(_pyproject()["build-system"]["requires"])
    assert requires["setuptools"].specifier.contains("77") and not requires["setuptools"].specifier.contains("76.9")


def test_small_packages_are_default_dependencies_and_heavy_ones_extras():
    project = _pyproject()["project"]
    default = _requirement_names(project["dependencies"])
    # Pure Python and small: a plain install samples GPUs wherever NVML exists.
    assert "nvidia-ml-py" in default and default["nvidia-ml-py"].marker is None
    # A native wheel for Linux only: the marker keeps other systems installable.
    assert default["uvloop"].marker is not None
    assert default["uvloop"].marker.evaluate({"sys_platform": "linux"})
    assert not default["uvloop"].marker.evaluate({"sys_platform": "darwin"})
    for heavy in ("grpcio", "protobuf", "tokenizers", "pyarrow", "pandas", "scipy"):
        assert heavy not in default, f"{heavy} is heavy: an extra, not a default dependency"
    extras = project["optional-dependencies"]
    assert "grpcio" in _requirement_names(extras["grpc"]) and "tokenizers" in _requirement_names(extras["llm"])
    assert "pyarrow" in _requirement_names(extras["parquet"])
    # Older install commands keep working.
    assert "nvidia-ml-py" in _requirement_names(extras["gpu"]) and "uvloop" in _requirement_names(extras["async"])


# ------------------------------------------------------------- against the real CLI

def _clean_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOADGEN_") and k != "JOB_COMPLETION_INDEX"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


_HELP = {}


def _help(command):
    """`loadgen COMMAND --help`, or None when the CLI has no such command."""
    if command not in _HELP:
        done = subprocess.run([sys.executable, "-m", "loadgen", command, "--help"],
                              capture_output=True, text=True, timeout=60, env=_clean_env())
        _HELP[command] = done.stdout if done.returncode == 0 else None
    return _HELP[command]


def _has_flag(help_text, flag):
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text) is not None


def _invocations():
    """(where, subcommand, flags, LOADGEN_* env names) of every loadgen command line in
    deploy/, from container args (the image's ENTRYPOINT is `python -m loadgen`), explicit
    `python -m loadgen` commands, and `python -m loadgen ...` lines of shell scripts."""
    found = []

    def add(where, argv, env):
        sub = argv[0]
        flags = sorted({a.split("=", 1)[0] for a in argv[1:] if a.startswith("--")})
        found.append((where, sub, flags, sorted(k for k in env if k.startswith("LOADGEN_"))))

    def from_container(where, container):
        env = _env(container) if "env" in container else {}
        command = container.get("command", [])
        args = container.get("args", [])
        image = str(container.get("image", ""))
        if command[:2] == ["sh", "-c"]:
            for line in (command[2:] + args)[0].splitlines():
                if "python -m loadgen" in line:
                    words = shlex.split(line[line.index("python -m loadgen"):])
                    add(where, words[3:], env)
        elif command == ["python", "-m", "loadgen"] or (not command and "loadgen" in image):
            add(where, args, env)

    for name, pod in _pods():
        for container in pod["containers"]:
            from_container(f"deploy/k8s/{name}", container)
    for template in _load_one(ARGO_TEMPLATE)["spec"]["templates"]:
        if "container" in template:
            from_container(f"argo template {template['name']}", template["container"])
    return found


def test_the_manifests_run_the_expected_loadgen_commands():
    subs = sorted({sub for _, sub, _, _ in _invocations()})
    assert subs == ["merge", "run", "sweep"], subs


@pytest.mark.parametrize("subcommand", ["run", "merge", "sweep"])
def test_every_flag_and_variable_the_manifests_use_exists_in_the_cli(subcommand):
    if _help("run") is None:
        pytest.fail("`python -m loadgen run --help` failed")
    help_text = _help(subcommand)
    if help_text is None:
        pytest.skip(f"this loadgen has no `{subcommand}` command yet (`loadgen {subcommand} --help` failed)")
    # A sweep takes the run options too.
    accepted = help_text + (_help("run") if subcommand == "sweep" else "")
    checked = 0
    for where, sub, flags, env_names in _invocations():
        if sub != subcommand:
            continue
        for flag in flags:
            assert _has_flag(accepted, flag), f"{where}: `loadgen {sub}` has no {flag}"
            checked += 1
        for name in env_names:
            # `run --help` names each option's variable as [env LOADGEN_...].
            assert re.search(rf"\b{name}\b", _help("run")), f"{where}: {name} is no loadgen option's variable"
            checked += 1
    assert checked


def _expand(text, env):
    """Kubernetes' $(VAR) expansion of command and args: $$ is a literal $."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def _local(container, results, extra_env):
    """The container's env and args as the pod would see them, with /results moved to a
    local folder, the SUT replaced by the demo and a short run."""
    env = {k: v.replace("/results", str(results), 1) if v.startswith("/results") else v
           for k, v in _env(container).items()}
    env.update(extra_env)
    env.update(LOADGEN_DURATION_S="0.5", LOADGEN_WARMUP_S="0", LOADGEN_TARGET_QPS="400")
    # Live metrics on a free local port each, without the pod's linger.
    env.update(LOADGEN_METRICS_PORT="0", LOADGEN_METRICS_ADDR="127.0.0.1", LOADGEN_METRICS_LINGER_S="0")
    args = []
    for arg in container["args"]:
        arg = _expand(arg, env)
        if arg.startswith("--sut="):
            arg = "--sut=demo"
        elif arg.startswith("--output=/results"):
            arg = "--output=" + str(results) + arg[len("--output=/results"):]
        args.append(arg)
    return env, args


def _start(argv, env, cwd):
    full = _clean_env()
    full.update(env)
    return subprocess.Popen(argv, env=full, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc, timeout=60):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"timed out: {out}{err}")
    return proc.returncode, out + err


@pytest.mark.integration
def test_the_one_pod_job_runs_locally_as_written(tmp_path):
    if _help("run") is None:
        pytest.fail("`python -m loadgen run --help` failed")
    container = _pod_spec(_load_one(os.path.join(K8S, "job.yaml")))["containers"][0]
    results = tmp_path / "results"
    env, args = _local(container, results, {"POD_NAME": "loadgen-run-x7k2p"})
    rc, output = _finish(_start([sys.executable, "-m", "loadgen", *args], env, tmp_path))
    assert rc in (0, 1), output
    assert (results / "loadgen-run-x7k2p" / "result.json").is_file(), output


@pytest.mark.integration
def test_the_indexed_job_and_its_merge_run_locally_as_written(tmp_path):
    if _help("run") is None:
        pytest.fail("`python -m loadgen run --help` failed")
    workers = _load_one(os.path.join(K8S, "indexed-job.yaml"))
    container = workers["spec"]["template"]["spec"]["containers"][0]
    n = 2  # fewer than the manifest's, to stay quick; the contract is the same
    start_at = str(int(time.time()) + 3)
    results = tmp_path / "results"
    procs = []
    for index in range(n):
        extra = {"JOB_COMPLETION_INDEX": str(index), "LOADGEN_WORKERS": str(n)}
        local = {k: v.replace(PLACEHOLDER, start_at) for k, v in _env(container).items()}
        env, args = _local({**container, "env": [{"name": k, "value": v} for k, v in local.items()]},
                           results, extra)
        procs.append(_start([sys.executable, "-m", "loadgen", *args], env, tmp_path))
    run_dir = results / f"run-{start_at}"
    for index, proc in enumerate(procs):
        rc, output = _finish(proc)
        assert rc in (0, 1), output
        assert (run_dir / f"worker-{index}" / "result.json").is_file(), output
    if _help("merge") is None:
        pytest.skip("workers ran; this loadgen has no `merge` command yet, so the merge Job was not run")
    merge = _load_one(os.path.join(K8S, "merge-job.yaml"))["spec"]["template"]["spec"]["containers"][0]
    # The script calls `python`: this interpreter, virtual environment and all.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    (bin_dir / "python").chmod(0o755)
    env = {"WORKERS": str(n), "RUN_DIR": str(run_dir), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    rc, output = _finish(_start(merge["command"], env, tmp_path))
    assert rc in (0, 1), output
    assert (run_dir / "merged" / "result.json").is_file(), output


# ------------------------------------------------------------------------------ guide

def test_the_guide_names_only_files_that_exist():
    with open(GUIDE, encoding="utf-8") as f:
        text = f.read()
    headings = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    assert text.startswith("# ") and headings[0] == "In short", headings[:1]
    paths = set(re.findall(r"\b((?:deploy|docs)/[\w./-]*\w)", text))
    assert "deploy/k8s/indexed-job.yaml" in paths
    for path in paths:
        assert os.path.exists(os.path.join(ROOT, path)), f"docs/kubernetes.md names {path}, which does not exist"
