#!/usr/bin/env bash
# check.sh — spin-verify the kvfence writer-lifetime model (model/kvfence.pml).
#
#   model/check.sh quick   # for `make test`: reduced safe model + every known-unsafe variant
#   model/check.sh full    # for `make soak`: safe model with every fault, NG=1, exhaustive; the restart
#                          # fence at NG=2 with crashes, and with truncation (LEASE=TAIL=1, up
#                          # to ~5.3 GB); + quick
#   model/check.sh mutants # only the known-unsafe variants (each must yield a counterexample)
#   model/check.sh list    # print the runs of every mode without running them
#
# A run expected to PASS must finish its exhaustive search with no error (not cut short by
# time, memory or depth). A run expected to FAIL (a mutant) must produce a counterexample whose
# "assertion violated" line names the invariant given in the table below: a model check that
# cannot fail proves nothing. Exit status: 0 when every run met its expectation, 1 otherwise,
# 2 on a usage or tool error.
#
# Each run is built in its own directory under a fresh `mktemp -d` (never in the repo) and runs
# one pan at a time. KEEP=1 keeps every run directory; otherwise only the directories of runs
# that missed their expectation are kept (their path is printed). Every kept directory holds
# replay.sh, which replays pan.trail with the same -D options (see model/README.md).
#
# No -DCOLLAPSE: on this model it costs 3x the time and saves no memory.
# Environment: SPIN (default spin), CC (default gcc), QUICK_MEMLIM_MB / FULL_MEMLIM_MB
# (pan's -DMEMLIM, MB), QUICK_TIMEOUT_S / FULL_TIMEOUT_S (per-run wall clock limit),
# JOBS (runs at once; default nproc: each takes up to its MEMLIM).
set -u

MODE=${1:-quick}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODEL=$HERE/kvfence.pml
SPIN=${SPIN:-spin}
CC=${CC:-gcc}
QUICK_MEMLIM_MB=${QUICK_MEMLIM_MB:-2048}
FULL_MEMLIM_MB=${FULL_MEMLIM_MB:-8192}
QUICK_TIMEOUT_S=${QUICK_TIMEOUT_S:-150}
FULL_TIMEOUT_S=${FULL_TIMEOUT_S:-1800}

# name | expect (pass/fail) | spin -D options | invariant the counterexample must name (fail only)
# Defaults of the model: NG=2 TAIL=2 LEASE=2 SKEW=0 MARGIN=SKEW BOUND=LEASE+TAIL-1+MARGIN
#                        LOSS=1 DUP=1 CRASH=1 MAXHB=1 TRUNC=1 DRST=0
QUICK_SAFE='
safe_ng1_nodup          |pass|-DNG=1 -DDUP=0
safe_ng1_revoke         |pass|-DNG=1 -DREVOKE -DLOSS=0 -DDUP=0
safe_restart_quarantine |pass|-DNG=1 -DDRST=1 -DDRST_QUAR -DLOSS=0 -DDUP=0
safe_ng2_slot_reuse     |pass|-DNG=2 -DLEASE=1 -DTAIL=1 -DMAXHB=0 -DLOSS=0 -DDUP=0 -DCRASH=0 -DTRUNC=0
safe_ng1_writer_tail    |pass|-DNG=1 -DTAIL1=3 -DLOSS=0 -DDUP=0
safe_ng1_liar_revoke    |pass|-DNG=1 -DREVOKE -DLIAR -DLOSS=0 -DDUP=0
safe_ng1_restart_fence  |pass|-DNG=1 -DRESTART -DUNB0 -DLOSS=0 -DDUP=0
'
MUTANTS='
release_on_abort          |fail|-DNG=1 -DM_RELEASE_ON_ABORT                 |I1_isolation
ack_after_failed_send     |fail|-DNG=1 -DM_ACK_AFTER_FAIL                   |I5_failed_not_complete
ack_after_failed_send_e2e |fail|-DNG=1 -DM_ACK_AFTER_FAIL -DNO_I5           |I1_isolation
ignore_generations        |fail|-DNG=2 -DM_IGNORE_GEN                       |I4_stale_tag
ignore_generations_e2e    |fail|-DNG=2 -DM_IGNORE_GEN -DNO_I4               |I1_isolation|I2_handoff
timeout_short             |fail|-DNG=1 -DBOUND=2                            |I1_isolation
single_ack_target         |fail|-DNG=1 -DM_ONE_ACK -DLOSS=0 -DDUP=0         |I1_isolation
lease_margin0_skew1       |fail|-DNG=1 -DSKEW=1 -DMARGIN=0                  |I1_isolation
self_renewed_lease        |fail|-DNG=1 -DONEWAY -DSYNC                      |I1_isolation
self_renewed_lease_noloss |fail|-DNG=1 -DONEWAY -DSYNC -DLOSS=0             |I1_isolation
no_tombstones             |fail|-DNG=1 -DFORGET                             |I1_isolation
restart_reuse             |fail|-DNG=1 -DDRST=1                             |I1_isolation
succeeded_not_quiescent   |fail|-DNG=1 -DLATEDUP                            |I1_isolation
no_coverage_check         |fail|-DNG=1 -DNO_COVERAGE -DLOSS=0 -DDUP=0 -DCRASH=0|I2_handoff_full_coverage
release_on_remote_failure |fail|-DNG=1 -DM_RELEASE_ON_REMOTE_FAIL           |I1_isolation
own_tail_only             |fail|-DNG=1 -DTAIL1=3 -DM_OWN_TAIL -DLOSS=0 -DDUP=0|I1_isolation
release_on_drain_ack      |fail|-DNG=1 -DREVOKE -DLIAR -DM_RELEASE_ON_DRAIN_ACK -DLOSS=0 -DDUP=0|I1_isolation
liar_without_fence        |fail|-DNG=1 -DLIAR -DLOSS=0 -DDUP=0             |I1_isolation
release_before_reap       |fail|-DNG=2 -DRESTART -DUNB0 -DM_RELEASE_BEFORE_REAP -DLOSS=0 -DDUP=0|I1_isolation
release_before_reap_small |fail|-DNG=2 -DRESTART -DUNB0 -DM_RELEASE_BEFORE_REAP -DLEASE=1 -DTAIL=1 -DMAXHB=0 -DLOSS=0 -DDUP=0 -DCRASH=0 -DTRUNC=0|I1_isolation
rank_lease_forgotten      |fail|-DNG=1 -DM_FORGET_RENEWAL -DLOSS=0 -DDUP=0  |I1_isolation
'
FULL_SAFE='
safe_ng1_all_faults        |pass|-DNG=1
safe_restart_quarantine_loss|pass|-DNG=1 -DDRST=1 -DDRST_QUAR -DDUP=0
safe_ng2_restart_crash     |pass|-DNG=2 -DRESTART -DUNB0 -DLEASE=1 -DTAIL=1 -DMAXHB=0 -DLOSS=0 -DDUP=0 -DTRUNC=0
safe_ng2_restart_trunc     |pass|-DNG=2 -DRESTART -DUNB0 -DLEASE=1 -DTAIL=1 -DMAXHB=0 -DLOSS=0 -DDUP=0 -DCRASH=0
'

usage() { echo "usage: $0 quick|full|mutants|list" >&2; exit 2; }
case $MODE in quick|full|mutants|list) ;; *) usage ;; esac

if [ "$MODE" = list ]; then
  printf '# quick\n%s%s# full (adds)\n%s' "$QUICK_SAFE" "$MUTANTS" "$FULL_SAFE" | sed '/^$/d'
  exit 0
fi

for tool in "$SPIN" "$CC" timeout; do
  command -v "$tool" >/dev/null 2>&1 || { echo "check.sh: $tool not found (spin: Debian package 'spin')" >&2; exit 2; }
done
[ -r "$MODEL" ] || { echo "check.sh: $MODEL not readable" >&2; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvfence-model.XXXXXX") || exit 2
KEEP=${KEEP:-0}
keep_work=0
cleanup() {
  if [ "$KEEP" = 1 ] || [ $keep_work = 1 ]; then echo "run directories kept under $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bad=0
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
t_all=$(date +%s.%N)
printf '%-30s %-6s %-8s %12s %8s  %s\n' RUN EXPECT RESULT STATES SECONDS DETAIL

# run NAME EXPECT "DFLAGS" PATTERN MEMLIM_MB TIMEOUT_S OPT HASHBITS
run() {
  local name=$1 expect=$2 dflags=$3 pattern=$4 memlim=$5 tmo=$6 opt=$7 wbits=$8
  local d=$WORK/$name result detail states secs t0 t1 rc errs viol
  mkdir -p "$d" && cp "$MODEL" "$d/kvfence.pml"
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  if ! (cd "$d" && $SPIN $dflags -a kvfence.pml >spin.out 2>&1); then
    result=ERROR; detail="spin -a failed: $(head -c 200 "$d/spin.out" | tr '\n' ' ')"
  elif ! (cd "$d" && $CC $opt -DSAFETY -DVECTORSZ=2048 -DMEMLIM="$memlim" \
            -o pan pan.c >cc.err 2>&1); then
    result=ERROR; detail="cc failed: $(head -c 200 "$d/cc.err" | tr '\n' ' ')"
  else
    (cd "$d" && timeout "$tmo" ./pan -m100000 -w"$wbits" >pan.out 2>&1); rc=$?
    errs=$(grep -o 'errors: [0-9]*' "$d/pan.out" | awk '{print $2}')
    viol=$(grep -m1 -E 'assertion violated|acceptance cycle|invalid end state|non-progress' "$d/pan.out" | sed 's/^pan:[0-9]*: *//')
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      result=TIMEOUT; detail="no verdict within ${tmo}s"
    elif grep -q 'reached -DMEMLIM bound' "$d/pan.out"; then
      result=MEMLIM; detail="search cut short at ${memlim} MB"
    elif [ -z "$errs" ]; then
      result=ERROR; detail="pan rc=$rc: $(tail -c 200 "$d/pan.out" | tr '\n' ' ')"
    elif grep -q 'max search depth too small' "$d/pan.out"; then
      result=DEPTH; detail="search cut short by -m"
    elif [ "$errs" = 0 ]; then
      result=pass; detail="no errors, exhaustive"
    else
      result=fail; detail=$viol
    fi
  fi
  states=$(grep 'states, stored' "$d/pan.out" 2>/dev/null | awk '{print $1}')
  t1=$(date +%s.%N)
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')
  local verdict=ok
  if [ "$result" != "$expect" ]; then
    verdict=UNEXPECTED
  elif [ "$expect" = fail ] && ! grep -qE "assertion violated \(+($pattern)" "$d/pan.out"; then
    verdict=UNEXPECTED; detail="counterexample does not name $pattern: $detail"
  fi
  cat >"$d/replay.sh" <<EOF
#!/bin/sh
# replay the counterexample of run $name (spin needs the same -D options as the search)
cd "\$(dirname "\$0")" && exec $SPIN $dflags -t -p -g -l kvfence.pml
EOF
  chmod +x "$d/replay.sh"
  if [ $verdict != ok ]; then echo bad >"$d/verdict"; detail="$detail [kept: $d]"; fi
  printf '%-30s %-6s %-8s %12s %8s  %s%s\n' "$name" "$expect" "$result" "${states:--}" "$secs" \
    "$([ $verdict = ok ] || echo 'UNEXPECTED: ')" "$detail" >"$d/line"
}

# run_table TABLE MEMLIM TIMEOUT OPT HASHBITS
run_table() {
  local line name expect dflags pattern names=()
  while IFS= read -r line; do
    [ -z "${line// /}" ] && continue
    name=$(echo "$line" | cut -d'|' -f1 | tr -d ' ')
    expect=$(echo "$line" | cut -d'|' -f2 | tr -d ' ')
    dflags=$(echo "$line" | cut -d'|' -f3 | sed 's/ *$//')
    pattern=$(echo "$line" | cut -d'|' -f4- | tr -d ' ')
    # Runs are independent (a directory each): JOBS at once, printed in
    # table order once all are done.
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    run "$name" "$expect" "$dflags" "$pattern" "$2" "$3" "$4" "$5" &
    names+=("$name")
  done <<<"$1"
  wait
  for name in "${names[@]}"; do
    cat "$WORK/$name/line" 2>/dev/null || { echo "$name: no result"; bad=1; }
    if [ -e "$WORK/$name/verdict" ]; then bad=1; keep_work=1; fi
  done
}

if [ "$MODE" = full ]; then
  run_table "$FULL_SAFE" "$FULL_MEMLIM_MB" "$FULL_TIMEOUT_S" -O2 26
fi
[ "$MODE" = mutants ] || run_table "$QUICK_SAFE" "$QUICK_MEMLIM_MB" "$QUICK_TIMEOUT_S" -O2 24
# mutants find their counterexample within a few thousand states: -O0 compiles 4x faster
run_table "$MUTANTS" "$QUICK_MEMLIM_MB" "$QUICK_TIMEOUT_S" -O0 22

t_end=$(date +%s.%N)
printf 'check.sh %s: %s in %ss\n' "$MODE" "$([ $bad = 0 ] && echo 'all runs as expected' || echo 'FAILED')" \
  "$(awk -v a="$t_all" -v b="$t_end" 'BEGIN{printf "%.0f", b-a}')"
exit $bad
