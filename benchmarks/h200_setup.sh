# Sourced at the start of every H200 run: the wheels the GPU image lacks (fetched here by
# ../shared/gpu/wheels.sh into .whl/), then deepinfer itself, editable, without dependencies.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$HOME/site" .whl/*.whl
export PYTHONPATH="$HOME/site" PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1 || true
export PATH="$HOME/.local/bin:$PATH"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)"
