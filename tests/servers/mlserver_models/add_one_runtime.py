"""The custom MLServer runtime of the test models: OUTPUT0 = INPUT0 + 1, FP32, [N, 16].

MLServer imports this file itself (model-settings.json names it as
``add_one_runtime.AddOneRuntime``; the model repository's root is on its sys.path), in
the MLServer virtual environment: the test environment never imports it.
"""

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse

INPUT_NAME = "INPUT0"
OUTPUT_NAME = "OUTPUT0"
WIDTH = 16


class AddOneRuntime(MLModel):
    """Adds one to every element of INPUT0 and returns it as OUTPUT0."""

    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        inputs = [i for i in payload.inputs if i.name == INPUT_NAME]
        if len(inputs) != 1:
            raise InferenceError(f"expected exactly one input named {INPUT_NAME}, got "
                                 f"{[i.name for i in payload.inputs]}")
        request_input = inputs[0]
        if request_input.datatype != "FP32":
            raise InferenceError(f"{INPUT_NAME} must be FP32, not {request_input.datatype}")
        if len(request_input.shape) != 2 or request_input.shape[1] != WIDTH:
            raise InferenceError(f"{INPUT_NAME} must have shape [N, {WIDTH}], not "
                                 f"{request_input.shape}")
        x = NumpyCodec.decode_input(request_input).astype(np.float32, copy=False)
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            outputs=[NumpyCodec.encode_output(OUTPUT_NAME, x + np.float32(1))],
        )
