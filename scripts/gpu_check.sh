#!/usr/bin/env bash
# The one command to run on a machine with an NVIDIA GPU, no package registry needed:
#
#   scripts/gpu_check.sh WHEELHOUSE [--dry-run] [--build-pycuda] [--model NAME]...
#                        [--tune SECONDS] [--tune-model NAME]
#
# WHEELHOUSE: a folder made by scripts/make_wheelhouse.sh (it may be empty where the machine
# has numpy, cuda-bindings with NVRTC, and pytest). What is missing is installed from it into a
# private folder ($HEXIR_GPU_SITE, default ~/.cache/hexir/gpu-site-cpXY), never into the Python
# environment. Kernels run through the driver API: pycuda where it is installed or its wheel is
# in WHEELHOUSE (--build-pycuda builds it from its source distribution against the machine's
# CUDA toolkit, minutes of a lease), else cuda-bindings (hexir/runtime/cuda_driver.py), so
# nothing has to be compiled on the GPU machine. Then it runs the NVRTC and runner tests, every
# GPU test (`pytest -m gpu tests/gpu`: tests/conftest.py refuses a `gpu`-marked test anywhere
# else), benchmarks/matmul_gpu.py in float32 and float16 (cuBLAS through CuPy or PyTorch;
# float16 on tensor cores) and `hexir run MODEL
# --target cuda --profile --check` for each --model (default: mlp, bert-base, gpt2-decode; its
# end-to-end time replays a CUDA graph, beside the time of launching kernel by kernel), then
# tunes --tune-model (default bert-base) on the GPU for --tune SECONDS (default 60; 0: no tune;
# it needs sqlalchemy and xgboost, from the wheelhouse where missing) and times it end to end
# with its default and its tuned schedules, and prints a short table last. Exit status 0 only when every step passed; a skipped test fails the check,
# except the one test of Ray's GPU runners where Ray is not installed (its row says so).
# --dry-run, on any machine: installs from WHEELHOUSE into a scratch folder, checks that
# everything imports and that NVRTC compiles for the GPU archs, and prints the plan.
# Environment: PYTHON (default python3), CUDA_HOME (the toolkit pycuda builds against; found
# from nvcc otherwise), PYCUDA_CONFIGURE_ARGS (more options for pycuda's configure.py).
set -uo pipefail

usage() {
    echo "usage: scripts/gpu_check.sh WHEELHOUSE [--dry-run] [--build-pycuda] [--model NAME]..." >&2
    echo "                           [--tune SECONDS] [--tune-model NAME]" >&2
    echo "  (WHEELHOUSE: a folder made by scripts/make_wheelhouse.sh)" >&2
    exit 2
}
wheelhouse=""
dry_run=0
build_pycuda=0
models=()
tune=60
tune_model=bert-base
while (($#)); do
    case "$1" in
        --dry-run) dry_run=1; shift ;;
        --build-pycuda) build_pycuda=1; shift ;;
        --model) (($# > 1)) || usage; models+=("$2"); shift 2 ;;
        --tune) (($# > 1)) && [[ "$2" =~ ^[0-9]+$ ]] || usage; tune="$2"; shift 2 ;;
        --tune-model) (($# > 1)) || usage; tune_model="$2"; shift 2 ;;
        -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
        -*) usage ;;
        *) [[ -z "$wheelhouse" ]] || usage; wheelhouse="$1"; shift ;;
    esac
done
[[ -n "$wheelhouse" && -d "$wheelhouse" ]] || usage
((${#models[@]})) || models=(mlp bert-base gpt2-decode)
root="$(cd "$(dirname "$0")/.." && pwd)"
wheelhouse="$(cd "$wheelhouse" && pwd)"
py="${PYTHON:-python3}"
started=$SECONDS
status=0
rows=()
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

row() { rows+=("$(printf '%-36s %s' "$1" "$2")"); }
failed() { status=1; row "$1" "FAILED: $2"; }
table() {
    echo
    echo "== hexir GPU check ($((SECONDS - started)) s) =="
    printf '%s\n' "${rows[@]}"
    echo "result                               $( ((status)) && echo FAILED || echo passed)"
}

if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "gpu_check.sh: $py is not Python >= 3.11 (set PYTHON)" >&2
    exit 2
fi
pytag="$("$py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
site="${HEXIR_GPU_SITE:-${XDG_CACHE_HOME:-$HOME/.cache}/hexir/gpu-site-$pytag}"
built="$site.wheels"  # pycuda wheels built here
mkdir -p "$site" "$built"
export PYTHONPATH="$root:$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
cd "$root" || exit 2

# -- install what is missing -----------------------------------------------------------------

importable() { "$py" -c "import $1" >/dev/null 2>&1; }

install() {  # distributions, from the wheelhouse (and pycuda wheels built before) into $site
    "$py" -m pip install --quiet --disable-pip-version-check --no-index --only-binary=:all: \
        --find-links "$wheelhouse" --find-links "$built" --target "$site" --upgrade "$@"
}

cuda_root() {  # the CUDA toolkit with cuda.h: CUDA_HOME, CUDA_PATH, nvcc's, /usr/local/cuda
    local nvcc candidates=("${CUDA_HOME:-}" "${CUDA_PATH:-}")
    if nvcc="$(command -v nvcc)"; then
        candidates+=("$(dirname "$(dirname "$(readlink -f "$nvcc")")")" "$(dirname "$(dirname "$nvcc")")")
    fi
    for dir in "${candidates[@]}" /usr/local/cuda /opt/cuda; do
        [[ -n "$dir" && -f "$dir/include/cuda.h" ]] && { echo "$dir"; return 0; }
    done
    return 1
}

libcuda_dir() {  # a folder holding libcuda.so for the linker: the toolkit's stubs or the driver
    local cuda="$1" dir lib
    for dir in "$cuda"/lib64/stubs "$cuda"/lib/stubs "$cuda"/targets/*/lib/stubs \
        /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib/wsl/lib; do
        [[ -e "$dir/libcuda.so" ]] && { echo "$dir"; return 0; }
    done
    for dir in /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib/wsl/lib; do
        for lib in "$dir"/libcuda.so.1 "$dir"/libcuda.so.[0-9]*; do
            [[ -e "$lib" ]] || continue
            mkdir -p "$work/libcuda" && ln -sf "$lib" "$work/libcuda/libcuda.so"
            echo "$work/libcuda"
            return 0
        done
    done
    return 1
}

build_pycuda() {  # pycuda's sdist from the wheelhouse -> a wheel in $built
    local sdist cuda src libdir jobs args=()
    sdist="$(find "$wheelhouse" -maxdepth 1 -name 'pycuda-*.tar.gz' | sort -V | tail -n 1)"
    [[ -n "$sdist" ]] || { echo "no pycuda wheel or sdist in $wheelhouse"; return 1; }
    cuda="$(cuda_root)" || { echo "no CUDA toolkit (include/cuda.h) to build pycuda; set CUDA_HOME"; return 1; }
    if libdir="$(libcuda_dir "$cuda")"; then args+=("--cudadrv-lib-dir=$libdir"); fi
    # An older setuptools builds wheels only with the `wheel` package (in the wheelhouse).
    if ! "$py" -c 'import setuptools.command.bdist_wheel' 2>/dev/null && ! importable wheel; then
        install --no-deps wheel || return 1
    fi
    tar -xzf "$sdist" -C "$work" && src="$(find "$work" -maxdepth 1 -name 'pycuda-*' -type d)"
    jobs="$(nproc 2>/dev/null || echo 4)"
    echo "building pycuda from $(basename "$sdist") against $cuda ($jobs jobs)"
    # shellcheck disable=SC2086 # PYCUDA_CONFIGURE_ARGS is a list of options
    (cd "$src" &&
        "$py" configure.py --cuda-root="$cuda" --no-cuda-enable-curand "${args[@]}" \
            ${PYCUDA_CONFIGURE_ARGS:-} >/dev/null &&
        "$py" setup.py --quiet build_ext --parallel "$jobs" bdist_wheel --dist-dir "$built") \
        >"$work/pycuda-build.log" 2>&1 || { tail -n 30 "$work/pycuda-build.log"; return 1; }
    cp "$built"/pycuda-*.whl "$wheelhouse"/ 2>/dev/null || true  # for the next machine
}

# What each check needs, as (module distribution): only the missing ones are installed, with
# --no-deps, so nothing the environment has is shadowed by another version.
NEEDS=(numpy:numpy cuda.bindings.nvrtc:cuda-bindings pytest:pytest)
PYTEST_NEEDS=(iniconfig:iniconfig pluggy:pluggy packaging:packaging)
PYCUDA_NEEDS=(pytools:pytools platformdirs:platformdirs mako:mako markupsafe:markupsafe
    siphash24:siphash24 typing_extensions:typing-extensions)
BINDINGS_NEEDS=(cuda.pathfinder:cuda-pathfinder)
# A tune's database and cost model (xgboost-cpu: XGBoost without its CUDA build, 6 MB).
TUNE_NEEDS=(sqlalchemy:sqlalchemy xgboost:xgboost-cpu typing_extensions:typing-extensions)

missing_of() {  # module:distribution pairs -> the distributions whose module does not import
    local pair
    for pair in "$@"; do importable "${pair%%:*}" || echo "${pair#*:}"; done
}

has_pycuda() {  # pycuda importable, or its wheel at hand, or its build asked for
    importable pycuda || ((build_pycuda)) ||
        [[ -n "$(find "$wheelhouse" "$built" -maxdepth 1 -name 'pycuda-*.whl' 2>/dev/null)" ]]
}

setup() {
    local step=$SECONDS note="nothing to install" missing
    mapfile -t missing < <(missing_of "${NEEDS[@]}")
    [[ " ${missing[*]} " == *" pytest "* ]] && mapfile -t -O "${#missing[@]}" missing < <(missing_of "${PYTEST_NEEDS[@]}")
    [[ " ${missing[*]} " == *" cuda-bindings "* ]] && mapfile -t -O "${#missing[@]}" missing < <(missing_of "${BINDINGS_NEEDS[@]}")
    if has_pycuda; then
        mapfile -t -O "${#missing[@]}" missing < <(missing_of pycuda:pycuda "${PYCUDA_NEEDS[@]}")
    fi
    if ((${#missing[@]})); then
        note="installed ${missing[*]}"
        if [[ " ${missing[*]} " == *" pycuda "* ]] && ! install --no-deps pycuda 2>/dev/null; then
            build_pycuda || return 1
            note="$note (pycuda built from its sdist)"
        fi
        install --no-deps "${missing[@]}" || return 1
    fi
    if ! "$py" -c 'from hexir.runtime.nvrtc import nvrtc_version; nvrtc_version()' 2>/dev/null; then
        install --no-deps nvidia-cuda-nvrtc || return 1
        note="$note, nvidia-cuda-nvrtc"
    fi
    "$py" -c 'import numpy, pytest, cuda.bindings.driver, cuda.bindings.nvrtc' || return 1
    if ((tune)); then  # where the wheelhouse lacks them, the tune is reported as not run
        mapfile -t missing < <(missing_of "${TUNE_NEEDS[@]}")
        if ((${#missing[@]})) && install --no-deps "${missing[@]}" 2>/dev/null; then
            [[ "$note" == "nothing to install" ]] && note="installed" || note="$note,"
            note="$note ${missing[*]}"
        fi
    fi
    echo "$note ($((SECONDS - step)) s)"
}

can_tune() { importable sqlalchemy && importable xgboost; }

if ((dry_run)); then  # a scratch site: nothing this machine has kept from a real run
    site="$work/site"
    built="$work/site.wheels"
    mkdir -p "$site" "$built"
    export PYTHONPATH="$root:$site${PYTHONPATH:+:$PYTHONPATH}"
fi

if note="$(setup 2>&1)"; then
    row "install" "$(tail -n 1 <<<"$note")"
else
    echo "$note"
    failed "install" "see above; the wheelhouse needs scripts/make_wheelhouse.sh's files"
    table
    exit 1
fi

# -- dry run: what would run -------------------------------------------------------------------

if ((dry_run)); then
    compiled="$("$py" - <<'PYEOF' 2>&1
import tempfile
import hexir
from hexir import knobs
from hexir.runtime.cuda_driver import load
from hexir.runtime.nvrtc import nvrtc_version
from hexir.schedule.handwritten import gpu_schedule
func = gpu_schedule(hexir.workload("matmul", M=256, N=256, K=256)).func
with knobs.scope(cache_dir=tempfile.mkdtemp()):
    for arch in ("sm_80", "sm_90"):
        hexir.build(func, f"cuda -arch={arch}")
print(f"NVRTC {nvrtc_version()} compiles for sm_80 and sm_90; runner: {load().name}")
PYEOF
)" && row "NVRTC" "$compiled" || failed "NVRTC" "$(tail -n 1 <<<"$compiled")"
    row "plan" "tests/runtime/test_nvrtc.py tests/runtime/test_cuda_kernel.py, -m gpu tests/gpu"
    row "" "benchmarks/matmul_gpu.py; hexir run {${models[*]}} --target cuda --profile --check"
    if ((tune == 0)); then
        row "" "no tune (--tune 0)"
    elif can_tune; then
        row "" "hexir tune $tune_model --target cuda --time-budget ${tune}s, default vs tuned"
    else
        failed "tune" "sqlalchemy or xgboost neither installed nor in the wheelhouse"
    fi
    table
    exit "$status"
fi

# -- is there a GPU to run on ------------------------------------------------------------------

gpu="$("$py" - <<'PYEOF' 2>&1
import sys
from hexir.runtime.cuda_kernel import gpu_unavailable_reason
from hexir.runtime.cuda_driver import load
from hexir.runtime.nvrtc import nvrtc_version
reason = gpu_unavailable_reason()
if reason:
    sys.exit(reason)
driver = load()
d = driver.device()
print(f"{d.name} ({d.arch}), driver CUDA {driver.version()}, NVRTC {nvrtc_version()}, "
      f"runner {driver.name}")
PYEOF
)"
if (($? != 0)); then
    echo "$gpu"
    failed "GPU" "$(tail -n 1 <<<"$gpu" | cut -c 1-100)..."
    table
    exit 1
fi
row "GPU" "$gpu"

# -- tests -------------------------------------------------------------------------------------

summary() {  # a junit XML file -> "N passed, N failed, N skipped"; exit 1 unless all passed
    "$py" - "$1" <<'PYEOF'
import sys, xml.etree.ElementTree as ET
try:
    suite = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    sys.exit("no results (pytest did not finish)")
suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
bad = n["failures"] + n["errors"]
print(f"{n['tests'] - bad - n['skipped']} passed, {bad} failed, {n['skipped']} skipped")
sys.exit(1 if bad or n["skipped"] or not n["tests"] else 0)
PYEOF
}

run_tests() {  # label, timeout seconds, pytest arguments...
    local label="$1" limit="$2" result
    shift 2
    echo "== $label: pytest $*"
    timeout "$limit" "$py" -m pytest -q -p no:cacheprovider --junitxml="$work/junit.xml" "$@"
    if result="$(summary "$work/junit.xml")"; then row "$label" "$result"; else failed "$label" "$result"; fi
    rm -f "$work/junit.xml"
}

# Where no GPU is missing, a skip means something else is (a schedule, a module): it fails too.
run_tests "NVRTC and runner tests" 120 tests/runtime/test_nvrtc.py tests/runtime/test_cuda_kernel.py \
    -k "not without_a_gpu and not says_no_gpu"
ray_test=tests/gpu/test_gpu_measure.py::test_cuda_candidates_are_measured_on_gpu_runners
if importable ray; then
    run_tests "GPU tests (pytest -m gpu)" 240 -m gpu tests/gpu
else
    run_tests "GPU tests (pytest -m gpu)" 240 -m gpu tests/gpu --deselect "$ray_test"
    row "GPU tests on Ray's runners" "not run: Ray is not installed here"
fi

# -- benchmarks --------------------------------------------------------------------------------

for dtype in float32 float16; do  # float16: tensor cores (mma.sync) against cuBLAS's
    echo "== benchmarks/matmul_gpu.py --dtype $dtype"
    also=()  # float32: the tile the default replaced (8x4 outputs a thread), timed beside it
    [[ $dtype == float32 ]] && also=(--also 8,32,8,4,64)
    if timeout 150 "$py" benchmarks/matmul_gpu.py --dtype "$dtype" "${also[@]}" \
        --summary "$work/bench.json"; then
        while IFS= read -r line; do rows+=("$line"); done < <("$py" - "$work/bench.json" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))
name = f"hand matmul {s['size']} {s['dtype']}"
print(f"{name:36} {s['hexir_tflops']:.1f} TFLOP/s ({s['hexir_ms']:.2f} ms)")
print(f"{s['vendor']:36} {s['vendor_tflops']:.1f} TFLOP/s ({s['vendor_ms']:.2f} ms)")
print(f"{'ratio (hand / vendor)':36} {s['ratio']:.3f}")
for name, ratio in s.get("also", {}).items():
    print(f"{'ratio, ' + name.split('(')[-1].rstrip(')'):36} {ratio:.3f}")
PYEOF
)
    else
        failed "benchmarks/matmul_gpu.py --dtype $dtype" "exit status $? (see above)"
    fi
done

for model in "${models[@]}"; do  # a whole model: built, checked against numpy, profiled
    echo "== hexir run $model --target cuda --profile --check"
    log="$work/model.log"
    if timeout 180 "$py" -m hexir run "$model" --target cuda --profile --check --repeats 20 \
        >"$log" 2>&1; then
        cat "$log"
        # The same model launched kernel by kernel, to compare with the CUDA graph's replay.
        eager="$(HEXIR_CUDA_GRAPHS=0 timeout 120 "$py" -m hexir run "$model" --target cuda \
            --bench --repeats 20 2>&1 | awk '/^bench /{print $2}')"
        row "model $model" "$(awk -v eager="${eager:-?}" '/^check /{$1=""; c=$0}
            /^ *end to end /{e=$NF} END {printf "%s ms end to end (%s eager),%s", e, eager, c}' "$log")"
    else
        cat "$log"
        failed "model $model" "$(tail -n 1 "$log" | cut -c 1-90)"
    fi
done

if ((tune)) && ! can_tune; then
    row "tune $tune_model" "not run: sqlalchemy or xgboost not installed (scripts/make_wheelhouse.sh)"
elif ((tune)); then  # the search on the GPU: the model end to end, default and tuned schedules
    echo "== hexir tune $tune_model --target cuda --time-budget ${tune}s"
    db="sqlite:///$work/tune.db"
    log="$work/tune.log"
    timeout $((tune + 120)) "$py" -m hexir tune "$tune_model" --target cuda --no-ray \
        --time-budget "${tune}s" --db "$db" >"$log" 2>&1
    code=$?
    tail -n 20 "$log"
    bench() { timeout 120 "$py" -m hexir run "$tune_model" --target cuda --bench --repeats 100 \
        "$@" 2>&1 | awk '/^bench /{print $2}'; }
    default="$(bench)" tuned="$(bench --db "$db")"
    trials="$(awk '/^tuned /{for (i = 1; i < NF; i++) if ($(i + 1) == "trials") print $i}' "$log")"
    if ((code == 0)) && [[ -n "$default" && -n "$tuned" ]]; then
        row "tune $tune_model (${tune} s)" "$(awk -v d="$default" -v t="$tuned" -v n="${trials:-?}" \
            'BEGIN {printf "%s trials: %s ms default, %s ms tuned end to end (%.2fx)", n, d, t, d / t}')"
    else
        failed "tune $tune_model" "exit status $code (see above)"
    fi
fi

table
exit "$status"
