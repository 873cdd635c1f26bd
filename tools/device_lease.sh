#!/usr/bin/env bash
# One GPU lease, prepared: what the device machine runs from the repository root, everything it writes under $OUT
# (the device tool brings back at most 8 files, at most two folders down).
#
#   bash tools/device_lease.sh     # carry build/zoo-cache (make device-cache: the MegaMNIST digits) and .whl, if any
#
# 1. Wheels carried in $WHEELS (default .whl) are installed into $SITE (default /tmp/site), which goes first on
#    PYTHONPATH: a package the machine lacks, or another version of one.
# 2. The machine: nvidia-smi -L (where there is one), Python, torch, CUDA and triton versions.
# 3. With $KERNEL_TIMEOUT > 0, the fused kernels' block sizes (`zoo_bench.kernel_configs`, the maps in
#    $KERNEL_MAPS, default all; about 20 s a configuration) into $OUT; the fastest of each map swept are exported as
#    ZOO_FUSED_CONFIG for what follows. A map the sweep did not finish keeps the kernels' own block sizes: the fused
#    kernels stay on (a lease that turned them off measured the torch paths in their place).
# 3a. The fused kernels kernel by kernel (`zoo_bench.kernel_profile`, at most $PROFILE_TIMEOUT s) into $OUT; the
#    layouts it timed more than 3 % faster than a map's default are exported as ZOO_FUSED_CONFIG for what follows
#    (unless it is set), and the check records it.
# 3b. `make device-check` into $OUT/check, stopped after $CHECK_TIMEOUT s (its report is rewritten after every item,
#    so a run cut short keeps what finished). The folder is then packed into $OUT/check.tar.gz, its device_check.md
#    and device_check.json left beside it.
# 4. `make device-test`, stopped after $TEST_TIMEOUT s (default 0: a second call, `PROFILE_TIMEOUT=0 CHECK_TIMEOUT=0
#    TEST_TIMEOUT=330 bash tools/device_lease.sh`, right after the first while the machine is warm); its output in
#    $OUT/test.log too. Unless DEVICE_TEST_ARGS is
#    set (empty: every test, one process), the tests marked slow are left out (multi-process CPU runs by design,
#    Inductor's C++ builds) and the rest run in 8 processes where pytest-xdist is installed.
# 5. With $TRAIN_TIMEOUT > 0, `make device-train` into $OUT (device_train.json, device_train.md).
# 6. fla-core's causal path against the torch path (tests/attention/test_fla.py, at most $FLA_TIMEOUT s: fla
#    autotunes each kernel on its first call, minutes in all, so it runs last and alone; the check and the other
#    tests run with ZOO_FLA=0).
# A step whose timeout is 0 is skipped. $DEVICE (cuda; cpu for toy sizes) and the make variables (DEVICE_SCALE,
# DEVICE_PARTS, DEVICE_TESTS, DEVICE_TEST_ARGS, DEVICE_TRAIN_SECONDS, ...) pass through the environment. Everything
# printed goes to $OUT/lease.log too: 6 files with the default steps (the device tool brings back 8). The exit
# status is 0 when every step exited 0.
set -u -o pipefail

OUT=${OUT:-$PWD/device-check/lease}
DEVICE=${DEVICE:-cuda}
# the defaults fit one device call of 600 s: on an H200 the profile took 60 s, and the check's parts 15 + 147 + 64 +
# 86 s before the long part (45) and flex (25), with about 20 s of start-up; the tests need a call of their own
KERNEL_TIMEOUT=${KERNEL_TIMEOUT:-0}
KERNEL_MAPS=${KERNEL_MAPS:-}
PROFILE_TIMEOUT=${PROFILE_TIMEOUT:-80}
CHECK_TIMEOUT=${CHECK_TIMEOUT:-450}
FLA_TIMEOUT=${FLA_TIMEOUT:-0}
TEST_TIMEOUT=${TEST_TIMEOUT:-0}
TRAIN_TIMEOUT=${TRAIN_TIMEOUT:-0}
WHEELS=${WHEELS:-.whl}
SITE=${SITE:-/tmp/site}
PYTHON=${PYTHON:-python3}
export DEVICE PYTHONUNBUFFERED=1
mkdir -p "$OUT"

step() {
    # step NAME TIMEOUT LOG COMMAND...: COMMAND under `timeout`, its output into the file LOG too (- for none);
    # fails where COMMAND did not exit 0
    local name=$1 limit=$2 log=$3
    shift 3
    if [ "$limit" = 0 ]; then
        echo "== $name: skipped (timeout 0)"
        return 0
    fi
    echo "== $name (at most $limit s): $*"
    local start=$SECONDS code
    if [ "$log" = - ]; then
        timeout -k 15 "$limit" "$@"
        code=$?
    else
        timeout -k 15 "$limit" "$@" 2>&1 | tee "$log"
        code=${PIPESTATUS[0]}
    fi
    if [ "$code" = 124 ] || [ "$code" = 137 ]; then
        echo "== $name: stopped at its limit after $((SECONDS - start)) s"
    else
        echo "== $name: exit status $code after $((SECONDS - start)) s"
    fi
    [ "$code" = 0 ]
}

profile_config() {
    # The layouts the profile timed faster than a map's default (`fastest_config` in kernel_profile.json), for the
    # check and tests that follow, unless ZOO_FUSED_CONFIG is set already (by hand, or by the sweep)
    local chosen=""
    if [ -z "${ZOO_FUSED_CONFIG:-}" ] && [ -f "$OUT/kernel_profile.json" ]; then
        chosen=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("fastest_config", ""))' \
            "$OUT/kernel_profile.json" 2> /dev/null || true)
        if [ -n "$chosen" ]; then
            export ZOO_FUSED_CONFIG=$chosen
            echo "ZOO_FUSED_CONFIG=$chosen (the profile's fastest layouts)"
        fi
    fi
}

versions() {
    "$PYTHON" - << 'PY'
import platform

import torch

cuda = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}): {cuda}")
try:
    import triton

    print(f"triton {triton.__version__}")
except ImportError:
    print("no triton")
PY
}

pack_check() {
    # one archive of the check's folder (the sweep's plots and tables, batch 8's in a folder of their own), with
    # the report and its data beside it
    tar -czf "$OUT/check.tar.gz" -C "$OUT" check || return 1
    local name
    for name in device_check.md device_check.json; do
        if [ -f "$OUT/check/$name" ]; then
            cp "$OUT/check/$name" "$OUT/$name"
        fi
    done
    rm -rf "$OUT/check"
    echo "check.tar.gz: $(tar -tzf "$OUT/check.tar.gz" | tr '\n' ' ')"
}

lease() {
    local status=0
    echo "== lease in $PWD, results in $OUT, device $DEVICE"
    if compgen -G "$WHEELS/*.whl" > /dev/null; then
        echo "== installing the carried wheels into $SITE: $(cd "$WHEELS" && echo *.whl)"
        if "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$WHEELS"/*.whl; then
            export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
            echo "PYTHONPATH=$PYTHONPATH"
        else
            echo "== the wheels did not install; going on without them"
            status=1
        fi
    fi
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi -L
    else
        echo "no nvidia-smi on this machine"
    fi
    versions || status=1
    if [ -z "${DEVICE_TEST_ARGS+set}" ]; then
        DEVICE_TEST_ARGS='-m "not slow" --maxfail=30 --ignore=tests/attention/test_fla.py'
        if "$PYTHON" -c "import xdist" 2> /dev/null; then
            DEVICE_TEST_ARGS="-n 8 $DEVICE_TEST_ARGS"
        fi
    fi
    export DEVICE_TEST_ARGS
    echo "DEVICE_TEST_ARGS=$DEVICE_TEST_ARGS"

    if [ "$DEVICE" = cuda ] && [ "$KERNEL_TIMEOUT" != 0 ]; then
        # shellcheck disable=SC2086 # KERNEL_MAPS is a list of words
        step kernel-configs "$KERNEL_TIMEOUT" "$OUT/kernel_configs.log" \
            env PYTHONPATH=".:tools${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m zoo_bench.kernel_configs --out "$OUT" \
            --repeats 5 ${KERNEL_MAPS:+--maps $KERNEL_MAPS} || status=1
        local chosen
        chosen=$(grep -h '^ZOO_FUSED_CONFIG=' "$OUT/kernel_configs.log" | tail -n 1 | cut -d= -f2-)
        rm -f "$OUT/kernel_configs.log"
        if [ -n "$chosen" ]; then
            export ZOO_FUSED_CONFIG=$chosen
        fi
        echo "ZOO_FUSED_CONFIG=${ZOO_FUSED_CONFIG:-} (a map not named keeps the kernels' own block sizes)"
    fi
    if [ "$DEVICE" = cuda ]; then
        step kernel-profile "$PROFILE_TIMEOUT" - env PYTHONPATH=".:tools${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" \
            -m zoo_bench.kernel_profile --out "$OUT" --steps 5 || status=1
    fi
    profile_config
    export ZOO_FLA=0
    step device-check "$CHECK_TIMEOUT" - make -s device-check DEVICE="$DEVICE" DEVICE_OUT="$OUT/check" || status=1
    if [ -d "$OUT/check" ]; then
        pack_check || status=1
    fi
    step device-test "$TEST_TIMEOUT" "$OUT/test.log" make -s device-test || status=1
    step device-train "$TRAIN_TIMEOUT" - make -s device-train DEVICE="$DEVICE" DEVICE_OUT="$OUT" || status=1
    unset ZOO_FLA
    step fla "$FLA_TIMEOUT" "$OUT/fla.log" "$PYTHON" -m pytest tests/attention/test_fla.py -p no:xdist -p no:cacheprovider \
        -q -rfs || status=1

    echo "== returned (under $OUT):"
    (cd "$OUT" && find . -type f -exec ls -l {} +)
    echo "== lease exit status $status"
    return "$status"
}

lease 2>&1 | tee "$OUT/lease.log"
exit "${PIPESTATUS[0]}"
