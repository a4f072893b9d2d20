#!/bin/sh
# Runs inside the booted Debian 12 container of scripts/test-package, as
# the oneshot unit moat-pkgtest.service (after multi-user.target): checks
# the installed moat package and its service, writes one line per check
# to /out/log and "ok" or "failed" to /out/status, then powers off.
# The port of moat serve is in /etc/default/moat (SERVE_ARGS).
set -u
log=/out/log
failed=0
pass() { echo "PASS $*" >>"$log"; }
fail() { echo "FAIL $*" >>"$log"; failed=1; }
finish() {
  systemctl status moat --no-pager -l >>/out/status.txt 2>&1
  journalctl -b --no-pager -o short-monotonic >/out/journal.txt 2>&1
  if [ "$failed" = 0 ]; then echo ok >/out/status; else echo failed >/out/status; fi
  systemctl poweroff --no-block
  exit 0
}
. /etc/default/moat
port=${SERVE_ARGS##*:}
api=http://127.0.0.1:$port

# 1. The service is up, and was reported up only once it listened.
state=$(systemctl is-active moat)
[ "$state" = active ] && pass "systemctl is-active moat: active" || { fail "systemctl is-active moat: $state"; finish; }
# Right after activation (no retry): READY=1 came after listen.
if curl -fsS --max-time 5 "$api/v1/health" >/dev/null; then pass "GET /v1/health answers as soon as the unit is active"; else fail "GET /v1/health right after activation"; fi
j=$(journalctl -b -u moat.service -o cat --no-pager)
listen_line=$(printf '%s\n' "$j" | grep -n 'moat serve listening' | head -1 | cut -d: -f1)
started_line=$(printf '%s\n' "$j" | grep -n '^Started ' | head -1 | cut -d: -f1)
if [ -n "$listen_line" ] && [ -n "$started_line" ] && [ "$listen_line" -lt "$started_line" ]; then
  pass "journal: 'moat serve listening' (line $listen_line) before systemd's 'Started' (line $started_line)"
else
  fail "journal order: listening at '${listen_line:-none}', Started at '${started_line:-none}'"
fi
[ "$(systemctl show -P Type moat)" = notify ] && pass "Type=notify" || fail "Type is $(systemctl show -P Type moat)"
[ "$(systemctl show -P NRestarts moat)" = 0 ] && pass "NRestarts=0" || fail "NRestarts=$(systemctl show -P NRestarts moat)"
v=$(systemd-analyze verify /usr/lib/systemd/system/moat.service 2>&1)
[ -z "$v" ] && pass "systemd-analyze verify moat.service: clean" || fail "systemd-analyze verify: $v"
[ "$(stat -c %a /var/lib/moat)" = 711 ] && pass "StateDirectory /var/lib/moat mode 711" || fail "/var/lib/moat mode $(stat -c %a /var/lib/moat)"
moat doctor >/out/doctor.txt 2>&1
grep -q 'inside sandboxes: /usr/lib/moat/moat-guest' /out/doctor.txt && pass "moat finds /usr/lib/moat/moat-guest (same source)" || fail "moat doctor: $(grep 'inside sandboxes' /out/doctor.txt)"
rv=$(moat-runtime --version 2>&1 | head -1)
case "$rv" in *moat*) pass "moat-runtime (the OCI runtime) answers: $rv" ;; *) fail "moat-runtime --version: $rv" ;; esac

# 2. A key and a real run through the API (the first run builds the
# python image from Debian's archive).
key=$(moat keys create --name pkgtest 2>/out/keys.err)
case "$key" in moat_*) pass "moat keys create" ;; *) fail "moat keys create printed '$key'"; finish ;; esac
auth="Authorization: Bearer $key"
t0=$(date +%s)
out=$(curl -sS --max-time 300 -H "$auth" -H 'Content-Type: application/json' \
  -d '{"argv": ["python3", "-c", "print(6*7)"]}' "$api/v1/runs")
if printf '%s' "$out" | grep -q '"data":"42\\n"'; then pass "POST /v1/runs python3 -c 'print(6*7)': 42 ($(( $(date +%s) - t0 )) s, with the image build)"; else fail "POST /v1/runs: $out"; finish; fi

# The wasm tier from the moat-wasm package, when it was installed.
if dpkg-query -W -f='${Status}' moat-wasm 2>/dev/null | grep -q 'install ok installed'; then
  grep -q '^  wasm    ready' /out/doctor.txt && pass "moat doctor: wasm ready (moat-wasm in /usr/lib/moat/wasm)" || fail "moat doctor: $(grep '^  wasm' /out/doctor.txt)"
  w=$(moat run --tier wasm -- node -e 'console.log(6*7)' 2>&1)
  [ "$w" = 42 ] && pass "moat run --tier wasm -- node -e 'console.log(6*7)': 42" || fail "wasm run: $w"
fi

# 3. systemctl stop drains a run in flight, then nothing is left.
curl -sS --max-time 120 -H "$auth" -H 'Content-Type: application/json' \
  -d '{"argv": ["python3", "-c", "import time; time.sleep(4); print(\"drained\")"]}' "$api/v1/runs" >/tmp/inflight 2>&1 &
cpid=$!
# In flight: its audit record is "running" (runs/ alone holds the warm
# pool's sandboxes too).
i=0
until moat audit --json --kind run --outcome running 2>/dev/null | grep -q '"id"' || [ $i -ge 150 ]; do sleep 0.2; i=$((i+1)); done
[ $i -lt 150 ] && pass "a second run is in flight" || fail "the second run did not start"
# Where its cgroup is: on cgroup v2 in the unit's delegated subtree, beside
# moat serve's leaf moat-supervisor; on v1 at each controller's moat/.
runcg=$(find /sys/fs/cgroup -mindepth 2 -maxdepth 5 -type d -path '*/moat/*' 2>/dev/null | head -1)
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  case "$runcg" in
    /sys/fs/cgroup/system.slice/moat.service/moat/*) pass "cgroup v2: the run's cgroup is in the unit's subtree ($runcg)" ;;
    *) fail "cgroup v2: the run's cgroup is at '$runcg', not in /sys/fs/cgroup/system.slice/moat.service/moat/" ;;
  esac
  self=$(sed -n 's/^0:://p' /proc/$(systemctl show -P MainPID moat)/cgroup)
  [ "$self" = /system.slice/moat.service/moat-supervisor ] && pass "cgroup v2: moat serve moved itself into $self" || fail "cgroup v2: moat serve is in '$self'"
else
  [ -n "$runcg" ] && pass "cgroup v1: the run's cgroup is $runcg" || fail "cgroup v1: no run cgroup found while a run is in flight"
fi
systemctl stop moat
wait $cpid
if grep -q '"data":"drained\\n"' /tmp/inflight; then pass "systemctl stop let the run in flight finish (drain)"; else fail "run in flight after stop: $(cat /tmp/inflight)"; fi
state=$(systemctl is-active moat)
[ "$state" = inactive ] && pass "stopped: $state" || fail "after stop: $state"
[ "$(systemctl show -P Result moat)" = success ] && pass "Result=success" || fail "Result=$(systemctl show -P Result moat)"
journalctl -b -u moat.service -o cat --no-pager | grep -q '"shutting down"\|msg="shutting down"' && pass "moat serve logged its drain" || fail "no 'shutting down' in the journal"
left=$(find /sys/fs/cgroup -mindepth 2 -maxdepth 5 -type d -path '*/moat/*' 2>/dev/null)
[ -z "$left" ] && pass "no run cgroup left" || fail "run cgroups left: $left"
procs=$(find /sys/fs/cgroup -path '*/system.slice/moat.service/*' -name cgroup.procs -exec cat {} + 2>/dev/null)
[ -z "$procs" ] && pass "no process left in moat.service" || fail "processes left in moat.service: $procs"
[ -z "$(ls -A /var/lib/moat/runs 2>/dev/null)" ] && pass "no run directory left" || fail "left in /var/lib/moat/runs: $(ls -A /var/lib/moat/runs)"
finish
