#!/bin/bash
# The GPU path on a real GPU: two sshd nodes of this machine (own hostnames, so NCCL takes them for two hosts and
# lets both ranks use GPU 0 over its socket transport), the launcher against real nvidia-smi, CUDA torch and NCCL.
# Run on the device as .dev/device_check.sh (tests/gpu/prepare.sh puts it there): see tests/gpu/README.md.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/devout}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
step() { echo; echo "=== [${SECONDS}s] $*"; }
PY=${PY:-$(command -v python3)}
[ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3
INV="$PY -m invoke"
H=hosts/sandbox.yaml
ONLY=${1:-all}
want() { [ "$ONLY" = all ] || [[ ",$ONLY," == *",$1,"* ]]; }

step facts
nvidia-smi || true
nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total,utilization.gpu,persistence_mode --format=csv || true
head -2 /etc/os-release; nproc; id; uname -r
$PY -c "import sys,torch; print(sys.version, sys.executable, torch.__version__, torch.version.cuda, torch.cuda.is_available(), torch.cuda.nccl.version() if torch.cuda.is_available() else None)"
command -v sshd ssh-keygen unshare ssh rsync || true

step setup
[ -x /usr/sbin/sshd ] || cp .dev/ssh/sshd /usr/sbin/sshd
command -v ssh-keygen >/dev/null || cp .dev/ssh/ssh-keygen /usr/local/bin/ssh-keygen
for round in 1 2 3 4; do
    for l in $( (ldd /usr/sbin/sshd; ldd "$(command -v ssh-keygen)") | awk '/not found/{print $1}' | sort -u); do
        echo "bringing $l"; cp .dev/ssh/lib/"$l" /usr/local/lib/
    done
    ldconfig
done
ldd /usr/sbin/sshd | grep "not found"
getent passwd sshd >/dev/null || useradd -r -d /run/sshd -s /usr/sbin/nologin sshd \
    || echo 'sshd:x:988:65534::/run/sshd:/usr/sbin/nologin' >>/etc/passwd
if ! $PY -c "import fabric" 2>/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .dev/whl/*.whl
    export PYTHONPATH=/tmp/site
fi
if ! $PY -c "import matplotlib" 2>/dev/null && ls .dev/whl-report/*.whl >/dev/null 2>&1; then  # the page's extra
    $PY -m pip install -q --no-index --no-compile --no-cache-dir --target /tmp/site-report --find-links .dev/whl-report \
        matplotlib || echo "matplotlib did not install: the page has tables"
    $PY -c "import numpy" 2>/dev/null && rm -rf /tmp/site-report/numpy /tmp/site-report/numpy-* /tmp/site-report/numpy.libs
    export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/site-report
fi
$PY -c "import fabric, invoke, paramiko, rich, yaml, pathspec, dotenv; print('controller imports ok', paramiko.__version__)"

step sandbox up
$INV sandbox.up --nodes 2 --nproc-per-node 1 || { tail -5 .sandbox/node-*/sshd.log; exit 1; }
cat $H

if want doctor; then
    step doctor
    timeout 120 $INV doctor --hosts $H; echo "rc=$?"
    timeout 120 $INV doctor --hosts $H --json >"$OUT/doctor.json"; echo "rc=$?"
fi
if want ddp; then
    step launch train/ddp.py, attached
    timeout 180 $INV launch --hosts $H --script train/ddp.py --args "--epochs 1"; echo "rc=$?"
fi
if want top; then
    step a detached run: top, status, the doctor beside it, stop
    timeout 60 $INV launch --hosts $H --script train/ddp.py --args "--epochs 500 --sleep-per-step 0.02" --detach
    echo "rc=$?"
    sleep 25
    timeout 60 $INV top --hosts $H --once; echo "rc=$?"
    timeout 60 $INV top --hosts $H --once --json >"$OUT/top.json"; echo "rc=$?"
    nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv
    timeout 60 $INV status --hosts $H; echo "rc=$?"
    timeout 60 $INV doctor --hosts $H --fast; echo "rc=$?"
    timeout 60 $INV stop --hosts $H; echo "rc=$?"
    sleep 1
    nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv
fi
if want barrier; then
    step hang inside dist.barrier: found, NCCL dumps through the pipes, stopped
    timeout 150 $INV launch --hosts $H --script tests/gpu/gpu_hang.py --args "barrier 200" --hang-timeout 10 --skip-doctor
    echo "rc=$?"
fi
if want item; then
    step hang behind loss.item: NCCL watchdog at 60 s
    (timeout 170 $INV launch --hosts $H --script tests/gpu/gpu_hang.py --args "item 60" --hang-timeout 10 --skip-doctor
     echo "launch rc=$?") &
    job=$!; sleep 40
    timeout 60 $INV stacks --hosts $H; echo "stacks rc=$?"
    nvidia-smi --query-gpu=utilization.gpu --format=csv
    top -bn1 -w 200 | head -14
    wait $job  # not a bare `wait`: it waits for the log's tee too, for ever
fi
# --- issue #46: the judgement from the collectives (modes lhang,gitem,hfslow,slow,save) ---
keep() {  # the runs so far (each rank's collectives/<pid>, NCCL's dumps) into OUT, after each step: a call cut short keeps them
    tar czf "$OUT/logs.tgz" logs .sandbox/node-*/sshd.log .sandbox/node-*/cache/ddp-launcher/runs 2>/dev/null
}
setenv() {  # the jobs' knobs go to the nodes through the inventory's defaults.env
    $PY - "$@" <<'PYEOF'
import sys, yaml
path = "hosts/sandbox.yaml"
data = yaml.safe_load(open(path))
data["defaults"]["env"] = dict(arg.split("=", 1) for arg in sys.argv[1:])
yaml.safe_dump(data, open(path, "w"), sort_keys=False)
PYEOF
}
savepage() {  # the newest run's page and its `inv report --json` into $OUT/$1.html and $1.json (issue #49)
    local run; run=$(ls -t logs | head -1)
    timeout 60 $INV report --hosts $H --run "$run" --json >"$OUT/$1.json"; echo "report rc=$?"
    cp "logs/$run/report.html" "$OUT/$1.html"
    $PY -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['headline']); print(d['marks']); print(d['root_cause'])" \
        "$OUT/$1.json" 2>&1 | cut -c1-800
}
topjson() {  # `inv top --once --json` into $OUT/$1, and a summary of its verdicts
    timeout 60 $INV top --hosts $H --once --json >"$OUT/$1"; echo "top rc=$?"
    $PY -c "import json,sys; d=json.load(open(sys.argv[1])); [print({k: r.get(k) for k in ('rank','straggler','straggler_by','behind','lost_s_per_step','collectives_source')}) for r in d.get('ranks', [])]; print({k: d.get(k) for k in d if k != 'ranks'})" "$OUT/$1" 2>&1 | cut -c1-400
}
if want lhang; then
    step "Lightning on GPU, rank 1 stuck at step 20: found within 30 s of the hang, rank 1 behind"
    setenv BORING_GPU=1 BORING_STUCK_RANK=1 BORING_STUCK_STEP=20 BORING_STEPS=100000
    date +%T.%N
    timeout 200 $INV launch --hosts $H --script tests/scripts/lightning_boring.py --hang-timeout 15 --skip-doctor
    echo "rc=$?"; date +%T.%N; savepage lhang-page; keep
fi
if want slow; then
    step "plain DDP on GPU, rank 1 0.1 s slower a step (lines every 50 steps): straggler rank 1; each rank's in-process recorder dumps at step 3 into OUT/fr"
    setenv FR_PROBE_DIR="$OUT/fr"
    (timeout 150 $INV launch --hosts $H --script tests/gpu/gpu_hang.py --args "slow 120" --skip-doctor; echo "launch rc=$?") &
    job=$!; sleep 25; topjson slow_top.json; ls -la "$OUT/fr"; head -c 1200 "$OUT/fr/rank0_dump_nccl_trace.txt"; echo
    wait $job; keep
fi
if want gitem; then
    step "hang behind loss.item: found by the collectives (rank 1 behind) well before NCCL's watchdog (120 s)"
    setenv
    date +%T.%N
    (timeout 170 $INV launch --hosts $H --script tests/gpu/gpu_hang.py --args "item 120" --hang-timeout 10 --skip-doctor
     echo "launch rc=$?"; date +%T.%N) &
    job=$!; sleep 20
    timeout 60 $INV stacks --hosts $H; echo "stacks rc=$?"
    wait $job; keep
fi
if want hfslow; then
    step "HF Trainer on GPU, rank 1 0.15 s slower a step: top flags rank 1 by arrival, never rank 0"
    setenv HF_GPU=1 HF_SLOW_RANK=1 HF_SLOW_S=0.15 HF_STEPS=250
    (INVOKE_LAUNCHER_STRAGGLER_HOLD=10 timeout 200 $INV launch --hosts $H --script tests/scripts/hf_trainer.py \
        --skip-doctor; echo "launch rc=$?") &
    job=$!; sleep 30; topjson hf_top.json; timeout 60 $INV top --hosts $H --once; wait $job; savepage hfslow-page; keep
fi
if want save; then
    step "rank 0 busy 60 s (a checkpoint) while rank 1 waits in loss.item(): not a hang (--hang-timeout 15)"
    setenv
    timeout 150 $INV launch --hosts $H --script tests/gpu/gpu_hang.py --args "save 200" --hang-timeout 15 --skip-doctor
    echo "rc=$?"; keep
fi
if want page; then
    step "the run's page of a GPU run (issue #49): GPU use and memory per GPU on its timeline, rank 1 the slow one"
    setenv
    $PY -c "import matplotlib; print('matplotlib', matplotlib.__version__)" || echo "no matplotlib: the page has tables"
    timeout 150 $INV launch --hosts $H --script tests/gpu/gpu_hang.py --args "slow 120" --skip-doctor; echo "rc=$?"
    savepage page; keep
fi
if want net; then
    step doctor --net
    timeout 150 $INV doctor --hosts $H --net; echo "rc=$?"
fi
step down
$INV sandbox.down
tar czf "$OUT/logs.tgz" logs .sandbox/node-*/sshd.log .sandbox/node-*/cache/ddp-launcher/runs 2>/dev/null
ls -la "$OUT"
echo "done in ${SECONDS}s"
