# Sourced by the device scripts (bench/gpu_ppo.sh, device_flow_rl.sh, device_bc.sh): robotrl and the dependencies
# the device image lacks, installed for its Python 3.12. The dependencies travel as wheels in .whl/ (git-ignored;
# carry it), fetched here with
#   python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl brax==0.14.2 mujoco==4.0.0 mujoco-core==4.0.0 \
#     mujoco-studio==4.0.0 mujoco-mjx==3.17.0 jaxopt==0.8.5 ml_collections==1.1.0 trimesh==5.2.0 \
#     gymnasium==1.4.0 farama-notifications zarr==3.1.6 numcodecs==0.16.6 donfig google-crc32c glfw pyopengl \
#     tyro==1.0.17 docstring_parser==0.18.0 typeguard==4.6.1 lz4==4.4.5 cffi==2.1.1 pycparser==3.12 \
#     backports.zstd==1.8.0
# PYTHON (default python3) is the interpreter; NO_WHEELS=1 skips the wheels (a dry run on dev-2c with .venv's).
PYTHON=${PYTHON:-python3}
if [ -d .whl ] && [ -z "${NO_WHEELS:-}" ]; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site
fi
# robotrl.envs etc. map to top-level folders (pyproject package-dir): install the package rather than use $PWD.
"$PYTHON" -m pip install -q --no-deps --no-index --no-build-isolation --upgrade --target /tmp/robotrl-site . || exit 1
export PYTHONPATH=/tmp/robotrl-site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
