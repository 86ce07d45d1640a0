"""The `add_one` model of the Triton test server: OUTPUT0 = INPUT0 + 1 (FP32).

Triton's Python backend loads this file in its stub process; `triton_python_backend_utils`
is the module that backend provides.
"""

from typing import List

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Adds one to every element of INPUT0."""

    def execute(self, requests: List["pb_utils.InferenceRequest"]) -> List["pb_utils.InferenceResponse"]:
        """One response per request, in the requests' order."""
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (x + np.float32(1)).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
