#!/bin/sh
# late-arrival (run by guest.sh after the topology is up): the real
# late-arrival experiment. One decode rank (verbs plugin on rxe1) shared by
# two prefill ranks (verbs plugin on rxe0), every byte over Soft-RoCE and
# the veth pair, with netem (delay, jitter, loss) on both veths so RC
# retransmissions really make writes arrive late; decode advertises its
# handshake address on four loopback hosts, so each prefill rank opens four
# QPs (lanes) and a later request's writes overtake an earlier one's.
# A share of the requests is aborted while their writes are in flight.
#
#   unsafe arm: --unsafe release-on-abort (fence off, as the demo runs unsafe
#               variants): a late write lands in another request's pages or
#               in free memory; the content oracle must report corrupt_pages > 0.
#   safe arm:   kvfence as shipped (fence on): corrupt_pages 0, aborts > 0,
#               and kvfence __holds-check on the decode log: every aborted tag
#               went hold start → drain acknowledgement (or fence) → release,
#               never "unsafe". Releases by timeout (the protocol's bound, legal
#               when the emulated host is too slow to renew leases or confirm
#               fences) are allowed and reported: the gate is that none is
#               released without drain, fence or the bound, and corrupt_pages 0.
#               A CI log with timeouts > 0 means the VM ran short of CPU.
#   fence arm:  the safe arm with prefill rank 2 killed (kill -9) mid-run: a
#               dead rank never drains, so decode fences its holds at once
#               with the verbs plugin's Revoke on rxe1 (memory windows) and
#               releases them fenced; corrupt_pages 0, released_fenced > 0,
#               nothing held at the end, holds check as in the safe arm.
# Results: /results/late-arrival/ (JSON summaries, holds checks, decode logs).
# Exit status: number of failed checks.
K=/usr/bin/kvfence
P=/usr/bin/kvfence-plugin-verbs
R=/results/late-arrival
mkdir -p "$R"
up() { cut -d' ' -f1 /proc/uptime; }
tc() { /usr/sbin/tc "$@"; }
# Sized for a 2-vCPU TCG VM, where the six agent and plugin processes keep
# both vCPUs busy (a few requests/s): at higher concurrency a request waits
# for CPU past its lease and ends lease-lapsed instead of aborted, so the
# decode lease is stretched for emulation (5 s, at most 30 s per request)
# and the pools are cut to 16 MiB (registration is slow under TCG).
# netem: jitter without reordering (rate keeps netem's queue in order;
# reordering, or a long delay with loss, makes go-back-N crawl), 1% loss per
# packet: an 8 KiB page is 8 RoCE packets, so many batches need a
# retransmission, and a write queued behind it on its QP lands late.
NETEM="delay 4ms 2ms loss 1% rate 1gbit"
REQ=96 CONC=12
ARMS="unsafe safe fence" EXTRA="" KILL=4s
# Prefill's QPs wait 4.096 us x 2^18 (~1.07 s) before a retransmission (the
# default 14 is ~67 ms): a write whose last packet was lost then lands about
# a second late, after its freed slot went to the next request and that
# request wrote it, so the unsafe arm shows overwrites of another request's
# pages, not only writes into free memory. Prefill declares the longer tail
# in its Hello, and decode bounds its holds by it.
PTO=18
# Tuning without a rebuild: kernel args kvf.la.req=N kvf.la.conc=N
# kvf.la.arms=unsafe,safe,fence kvf.la.netem=delay,4ms,... kvf.la.demo=--flag=v,...
# kvf.la.kill=4s kvf.la.pto=18 (commas stand for spaces).
for a in $(cat /proc/cmdline); do
  v=$(echo "${a#*=}" | tr , ' ')
  case $a in
    kvf.la.req=*) REQ=$v;; kvf.la.conc=*) CONC=$v;; kvf.la.arms=*) ARMS=$v;;
    kvf.la.netem=*) NETEM=$v;; kvf.la.demo=*) EXTRA=$v;; kvf.la.kill=*) KILL=$v;; kvf.la.pto=*) PTO=$v;;
  esac
done
FAILS=0
fail() { echo "KVF late-arrival FAIL: $*"; FAILS=$((FAILS + 1)); }
num() { grep -o "\"$1\":[0-9.]*" "$2" | head -1 | cut -d: -f2; }

arm() {  # arm NAME DEMO-FLAGS...: one demo run, summary in $R/NAME.json
  n=$1; shift
  s=$(up)
  rm -rf "/tmp/la-$n"
  ( sleep 15; top -b -n 1 | head -14 > "$R/$n-top.txt" ) &
  timeout 240 "$K" demo --plugin "$P" \
    --prefill-plugin-env KVFENCE_VERBS_DEVICE=rxe0 --prefill-plugin-env KVFENCE_VERBS_TIMEOUT=$PTO \
    --decode-plugin-env KVFENCE_VERBS_DEVICE=rxe1 --decode-plugin-env KVFENCE_VERBS_LISTEN=0.0.0.0:0 \
    --data-hosts 127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4 \
    --requests $REQ --concurrency $CONC --abort-share 0.4 --data-delay 600ms \
    --agent-arg=--lease=5s --agent-arg=--max-hold=30s --agent-arg=--slots=1024 --agent-arg=--source-pages=2048 \
    --json --quiet --report none --dir "/tmp/la-$n" $EXTRA "$@" > "$R/$n.json" 2> "$R/$n.err"
  rc=$?
  echo "KVF late-arrival $n: demo rc=$rc wall=$(echo "$(up) $s" | awk '{printf "%.1f", $1-$2}')s"
  cat "$R/$n.json"
  tail -5 "$R/$n.err"
  [ -f "/tmp/la-$n/decode-0.log" ] && {
    { grep -E '"hold (start|evidence|fence|release)"' "/tmp/la-$n/decode-0.log" | head -40
      grep -E 'CORRUPT|FREE MEMORY' "/tmp/la-$n/decode-0.log" | head -40; } > "$R/$n-decode-excerpt.log"
    for f in /tmp/la-$n/*.log; do gzip -c "$f" > "$R/$n-$(basename "$f").gz"; done
  }
  return $rc
}

# netem must not outlive this step (the bandwidth step follows), even when
# guest.sh's timeout stops it.
trap 'tc qdisc del dev veth0 root 2>/dev/null; tc qdisc del dev veth1 root 2>/dev/null' EXIT
trap 'exit 99' TERM INT
echo "netem on veth0 and veth1: $NETEM"
tc qdisc add dev veth0 root netem $NETEM
tc qdisc add dev veth1 root netem $NETEM

case " $ARMS " in *" unsafe "*)
  arm unsafe --unsafe release-on-abort || fail "unsafe arm did not finish"
  c=$(num corrupt_pages "$R/unsafe.json"); a=$(num aborts "$R/unsafe.json")
  o=$(grep -c 'CORRUPT PAGE' /tmp/la-unsafe/decode-0.log 2>/dev/null)
  echo "KVF late-arrival unsafe: aborts=${a:-?} corrupt_pages=${c:-?} (want > 0): ${o:-0} overwrote another request's written page, the rest landed in free memory"
  [ "${c:-0}" -gt 0 ] || fail "unsafe arm: no corrupt page (the experiment did not make writes arrive late)"
  "$K" __holds-check --log /tmp/la-unsafe/decode-0.log > "$R/unsafe-holds.txt" 2>&1
  echo "unsafe arm holds check (expected to fail: released on abort): $(head -3 "$R/unsafe-holds.txt" | tr '\n' ' ')"
esac

# safe_gate NAME HOLDS-CHECK-FLAGS...: the checks both safe arms share.
safe_gate() {
  n=$1; shift
  c=$(num corrupt_pages "$R/$n.json"); a=$(num aborts "$R/$n.json"); u=$(num unreleased_exposures "$R/$n.json")
  f=$(num released_fenced "$R/$n.json"); v=$(num pages_verified "$R/$n.json")
  echo "KVF late-arrival $n: aborts=${a:-?} released_fenced=${f:-?} corrupt_pages=${c:-?} pages_verified=${v:-?} unreleased=${u:-?}"
  [ "${c:-1}" = 0 ] || fail "$n arm: corrupt_pages=${c:-?}"
  [ "${a:-0}" -gt 0 ] || fail "$n arm: no abort"
  [ "${u:-1}" = 0 ] || fail "$n arm: exposures still held at the end"
  "$K" __holds-check --log "/tmp/la-$n/decode-0.log" --allow-timeout "$@" > "$R/$n-holds.txt" 2>&1 || fail "$n arm: holds check"
  cat "$R/$n-holds.txt"
}

case " $ARMS " in *" safe "*)
  arm safe || fail "safe arm did not finish"
  a=$(num aborts "$R/safe.json"); safe_gate safe --expect "${a:-0}"
esac

case " $ARMS " in *" fence "*)
  arm fence --kill-prefill-after=$KILL || fail "fence arm did not finish"
  safe_gate fence
  [ "${f:-0}" -gt 0 ] || fail "fence arm: no hold released by fence (the receiver-side fence was not exercised)"
esac

tc -s qdisc show dev veth0 | head -3
echo "KVF late-arrival: $FAILS failed check(s)"
exit $FAILS
