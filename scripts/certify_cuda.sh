#!/usr/bin/env bash
# Certify the CUDA adapters on a machine with an NVIDIA GPU, as one prepared run.
#
#   scripts/certify_cuda.sh OUTDIR
#
# For each CUDA adapter (torch SDPA with each backend forced, and jax's cuDNN path when jax has a
# GPU) it writes a JSON + Markdown certificate and records a regression baseline under OUTDIR, then
# a side-by-side table of every certificate. Commit OUTDIR's contents under fixtures/cuda/<gpu>/:
# they are the per-hardware record that the next GPU, driver or torch version is compared against
# (pytest --impl=torch-sdpa-cuda --baseline=fixtures/cuda/<gpu>/baselines).
set -uo pipefail
out=${1:?usage: scripts/certify_cuda.sh OUTDIR}
mkdir -p "$out/baselines"
python - <<'PY' > "$out/environment.txt" 2>&1
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
print("cudnn", torch.backends.cudnn.version() if torch.cuda.is_available() else "none")
PY
cat "$out/environment.txt"
certs=()
for impl in torch-sdpa-cuda torch-sdpa-cuda-flash torch-sdpa-cuda-efficient torch-sdpa-cuda-cudnn torch-sdpa-cuda-math jax-cudnn; do
  echo "== $impl"
  python -m pytest --pyargs conformance --impl="$impl" -q -p no:cacheprovider \
      --certificate="$out/$impl.json" --record-baseline="$out/baselines" \
      2>&1 | tail -n 40 > "$out/$impl.log"
  tail -n 3 "$out/$impl.log"
  [ -f "$out/$impl.json" ] && certs+=("$out/$impl.json")
done
if [ ${#certs[@]} -gt 0 ]; then
  python -m conformance.certificates compare "${certs[@]}" > "$out/summary.md"
  cat "$out/summary.md"
fi
