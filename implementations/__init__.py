"""Adapters: one module per kernel, each importing only ``conformance.contract`` and its framework.

``BUILTINS`` maps the names accepted by ``--impl`` to ``module:attr`` of an adapter factory. Modules
are imported lazily, so a missing framework makes only its own adapters unavailable (reported as a
skip with the import error), never the suite.
"""

BUILTINS: dict[str, str] = {
    "numpy": "implementations.numpy_kernel:NumpyAdapter",
    "numpy-flash-attn": "implementations.numpy_flash:NumpyFlashAdapter",
    "numpy-flash-attn-varlen": "implementations.numpy_flash:NumpyFlashVarlenAdapter",
    "numpy-flash-attn-kvcache": "implementations.numpy_flash:NumpyFlashKVCacheAdapter",
    "flash-attn-cuda": "implementations.flash_attn_cuda:FlashAttnCuda",
    "flash-attn-cuda-varlen": "implementations.flash_attn_cuda:FlashAttnCudaVarlen",
    "flash-attn-cuda-kvcache": "implementations.flash_attn_cuda:FlashAttnCudaKVCache",
    "torch-eager": "implementations.torch_eager:TorchEagerAdapter",
    "torch-sdpa": "implementations.torch_sdpa:cpu_default",
    "torch-sdpa-math": "implementations.torch_sdpa:cpu_math",
    "torch-sdpa-flash": "implementations.torch_sdpa:cpu_flash",
    "torch-sdpa-cuda": "implementations.torch_sdpa:cuda_default",
    "torch-sdpa-cuda-flash": "implementations.torch_sdpa:cuda_flash",
    "torch-sdpa-cuda-efficient": "implementations.torch_sdpa:cuda_efficient",
    "torch-sdpa-cuda-cudnn": "implementations.torch_sdpa:cuda_cudnn",
    "torch-sdpa-cuda-math": "implementations.torch_sdpa:cuda_math",
    "torch-compile": "implementations.torch_compile:cpu",
    "torch-compile-cuda": "implementations.torch_compile:cuda",
    "torch-flex": "implementations.torch_flex:cpu",
    "torch-flex-cuda": "implementations.torch_flex:cuda",
    "jax": "implementations.jax_attention:xla",
    "jax-cudnn": "implementations.jax_attention:cudnn",
    "onnxruntime": "implementations.onnxruntime_attention:onnxruntime_cpu",
    "keras-numpy": "implementations.keras_numpy:keras_numpy",
    "keras-jax": "implementations.keras_jax:keras_jax",
    "keras-torch": "implementations.keras_torch:keras_torch",
    "hf-eager": "implementations.hf_eager:hf_eager",
    "hf-sdpa": "implementations.hf_sdpa:hf_sdpa",
    "mlx": "implementations.mlx_attention:mlx_cpu",
}

# torch.compile built-ins: inductor compiles C++ (or Triton) per input structure, tens of minutes for a
# cold certification on a 2-core CPU; the doc assets' matrix leaves them out unless asked
# (scripts/doc_assets.py --with-compiled).
INDUCTOR: frozenset[str] = frozenset({"torch-compile", "torch-compile-cuda", "torch-flex", "torch-flex-cuda"})
# Built-ins a bare ``pytest`` leaves out of its certification of every built-in: they compile a
# program per input structure (minutes of compiling, cold), so they are certified by name
# (``pytest --impl=jax``, ``tox -e jax``, ``tox -e keras`` for keras-jax, ``tox -e torch-compile``) and in
# the matrix. XLA compiles a program per structure: measured with --junitxml on a cold bare run
# (2026-12-03), jax's clauses were 348 s and keras-jax's 194 s of 989 s of clause time. The self-tests
# check the declarations of the inductor ones on a few structures (tests/test_compiled_adapters.py) and
# jax's adapter against jax itself (tests/test_adapter_declarations.py).
BY_NAME_ONLY: frozenset[str] = INDUCTOR | {"jax", "keras-jax"}
