#!/usr/bin/env bash
# Download, on a machine with a package registry, the files scripts/gpu_check.sh installs on a
# GPU machine that has none. Usage:
#
#   scripts/make_wheelhouse.sh [DIR] [--python 3.12] [--full]
#
# DIR (default .whl) receives, for CPython 3.12 on manylinux x86_64 unless --python says
# otherwise (about 13 MB):
#   pycuda-*.tar.gz         pycuda's source distribution (gpu_check.sh builds it there, against
#                           that machine's CUDA toolkit; PyPI has no pycuda wheels for Linux)
#   pytools, platformdirs, mako, siphash24, typing_extensions, markupsafe   pycuda's needs
#   wheel (<0.46: no needs)  so an older setuptools can build the pycuda wheel
#   sqlalchemy, xgboost-cpu  what gpu_check.sh's tune on the GPU needs (its database and cost
#                           model; xgboost-cpu is XGBoost without its CUDA build, 6 MB)
# With --full also what the GPU machines we use already have (about 120 MB more): numpy, scipy
# (XGBoost's), cuda-bindings, cuda-pathfinder and nvidia-cuda-nvrtc for CUDA $CUDA_MAJOR
# (default 13), pytest and its needs.
set -euo pipefail

dir=.whl
python_version=3.12
full=0
while (($#)); do
    case "$1" in
        --python) python_version="$2"; shift 2 ;;
        --full) full=1; shift ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
        -*) echo "make_wheelhouse.sh: unknown option $1" >&2; exit 2 ;;
        *) dir="$1"; shift ;;
    esac
done
mkdir -p "$dir"
py="${PYTHON:-python3}"
pycuda_version="${PYCUDA_VERSION:-2026.1}"
cuda_major="${CUDA_MAJOR:-13}"

platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
    manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
binary() {  # wheels for the GPU machine's Python, whatever this machine runs
    "$py" -m pip download --quiet --no-deps --only-binary=:all: --implementation cp \
        --python-version "$python_version" "${platforms[@]}" -d "$dir" "$@"
}

# pycuda's sdist. pip prepares its metadata (pycuda's setup waits 10 s when unconfigured);
# --no-binary for pycuda alone lets its build requirements come as wheels.
"$py" -m pip download --quiet --no-deps --no-binary=pycuda -d "$dir" "pycuda==$pycuda_version"
binary "pytools>=2024.1" "platformdirs>=2.2" "mako" "siphash24>=1.6" "typing-extensions>=4.5" \
    "markupsafe>=2" "wheel<0.46" "sqlalchemy>=2.0,<3" "xgboost-cpu>=2.0,<4"
if ((full)); then
    binary "numpy>=1.26,<3" scipy "cuda-bindings>=$cuda_major.0,<$((cuda_major + 1))" cuda-pathfinder \
        "nvidia-cuda-nvrtc>=$cuda_major.0,<$((cuda_major + 1))" "pytest>=8,<10" iniconfig pluggy \
        packaging
fi
echo "wheelhouse $dir ($(du -sh "$dir" | cut -f1)):"
ls -1 "$dir"
