#!/usr/bin/env bash
# A small cluster emulated on this machine: N nodes, each a network namespace with its own hostname
# and /dev/shm (UTS and mount namespaces held open by one holder process per node), joined by a
# bridge in a switch namespace, every node's link shaped by `tc tbf` in both directions. Open MPI
# starts across them through its real multi-host path: a hostfile, one daemon per node started
# by an rsh agent that enters the node, TCP between nodes, shared memory within a node.
#
#   emulate_cluster.sh up N [--slots K] [--link-rate RATE] [--slurm]
#                                                            N nodes, K rank slots each (default 1),
#                                                            links at RATE (default 1gbit); --slurm: a
#                                                            real Slurm over them (below)
#   emulate_cluster.sh run [-- ] ARGS...                     mpirun on node 0 with the cluster's
#                                                            hostfile, agent and interfaces, then ARGS
#   emulate_cluster.sh exec I [--] CMD...                    CMD on node I
#   emulate_cluster.sh link I down|up|RATE                   fault injection on node I's link
#   emulate_cluster.sh kill I [SIGNAL]                       signals every process of node I (default KILL)
#   emulate_cluster.sh revive I                              (--slurm) starts node I's slurmd again: a
#                                                            killed node comes back (ReturnToService=2)
#   emulate_cluster.sh pids I                                the processes running on node I
#   emulate_cluster.sh status                                nodes, addresses, links
#   emulate_cluster.sh down                                  removes everything `up` made
#
# --slurm starts Slurm's controller (slurmctld) in a namespace of its own on the bridge (host `ctl`,
# the subnet's .254), one slurmd per node (partition `emu`, K CPUs each), and munged on the host
# when none answers; each node then has its own /tmp, as real nodes do, so a job's files (its
# binaries, data and run directory) must be on a path every node sees, not under /tmp.
#   emulate_cluster.sh slurm CMD...   a Slurm command (sbatch, srun, squeue, scontrol, scancel,
#                                     sinfo) on node 0, the login node, with the cluster's SLURM_CONF
# Slurm's files (config, state, logs, the job completion log jobcomp.txt) are in <state>/slurm.
#
# Only addresses inside the namespaces it creates are used (10.213.47.0/24); the host's own network
# is not touched. A cluster is its state directory (MFSDP_EMULATE_DIR, default
# /run/mfsdp-emulated-cluster): its namespaces are named after it, so clusters with different state
# directories live side by side, and `down` removes only the namespaces, processes and files that
# this directory's `up` made (a directory holding anything else is kept, and said so). `up` removes
# the previous cluster of the same directory first; a failed or interrupted `up` (an error, INT or
# TERM) removes what it made. Where namespaces or tc are not permitted (not root, no CAP_SYS_ADMIN,
# no sch_tbf), it stops with one line and exit code 77; any other failure to set up is exit 1.
# Needs root, iproute2 (ip, tc) and util-linux (unshare, nsenter).
set -euo pipefail

STATE=${MFSDP_EMULATE_DIR:-/run/mfsdp-emulated-cluster}
SUBNET=10.213.47
SELF=$(readlink -f "${BASH_SOURCE[0]}")
# The files `up` makes in the state directory (and `down` removes), besides node<I>.pid / .err.
STATE_FILES=(cluster namespaces nodes hosts hostfile agent rate)

die() { echo "emulate_cluster: $*" >&2; exit 1; }
not_permitted() { echo "emulate_cluster: not permitted here: $* (needs root with network namespaces and tc)" >&2; exit 77; }
# The state path goes into Open MPI's agent option (split at spaces) and into scripts: plain characters only.
[[ "$STATE" =~ ^/[A-Za-z0-9._/-]+$ ]] ||
  die "MFSDP_EMULATE_DIR '$STATE' must be an absolute path of letters, digits, '.', '_', '-' and '/'"
# Namespace names carry a tag of the state directory: mfsdp-emu-<tag>-node<I>, -switch, -probe.
PREFIX=mfsdp-emu-$(printf '%s' "$STATE" | cksum | awk '{ printf "%08x", $1 }')
SWITCH=${PREFIX}-switch
node_ns() { echo "${PREFIX}-node$1"; }
nodes() { cat "$STATE/nodes" 2>/dev/null || echo 0; }
holder_pid() { cat "$STATE/node$1.pid" 2>/dev/null || die "no node $1 (is the cluster up? 'emulate_cluster.sh up N')"; }
check_node() {
  [[ "$1" =~ ^[0-9]+$ ]] || die "node index '$1' is not a number"
  (( $1 < $(nodes) )) || die "node $1 does not exist (the cluster has $(nodes) nodes)"
}
# A tc rate in bits per second, e.g. 1gbit, 200mbit, 1mbit; refuses anything else.
check_rate() {
  [[ "$1" =~ ^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit)$ ]] || die "link rate '$1' is not like 1gbit, 200mbit or 1mbit"
  [[ "$1" =~ ^0*\.?0*[a-z]+$ ]] && die "link rate '$1' is zero"
  return 0
}
# tbf's bucket: 10 ms of traffic at the rate, at least 32 KiB (several MTUs), so shaping is smooth
# at the kernel's timer resolution; packets queue up to 200 ms before they are dropped.
shape() {  # shape NETNS DEV RATE
  local bits
  bits=$(awk -v r="$3" 'BEGIN{ n=r+0; u=r; sub(/^[0-9.]+/,"",u);
    m = (u=="kbit")?1e3:(u=="mbit")?1e6:(u=="gbit")?1e9:1; printf "%d", n*m }')
  local burst=$(( bits / 800 )); (( burst < 32768 )) && burst=32768
  ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$3" burst "$burst" latency 200ms
}

# Whether the state directory is absent, empty or one `up` made (its `cluster` file says so).
state_is_ours() {
  [[ ! -e "$STATE" ]] && return 0
  [[ -d "$STATE" ]] || return 1
  [[ -z "$(ls -A "$STATE")" ]] && return 0
  [[ "$(head -c 64 "$STATE/cluster" 2>/dev/null)" == "mfsdp emulated cluster $PREFIX" ]]
}

# Every process in the namespaces this state directory lists is killed, the namespaces deleted,
# the files `up` made removed, and the directory too when nothing else is left in it.
cmd_down() {
  [[ -e "$STATE" ]] || return 0
  state_is_ours || die "$STATE is not the state directory of an emulated cluster; left as it is"
  local ns
  for ns in $(cat "$STATE/namespaces" 2>/dev/null || true); do
    [[ "$ns" == "$PREFIX"-* ]] || continue  # only names of this cluster
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns delete "$ns" 2>/dev/null || true
  done
  local f
  for f in "${STATE_FILES[@]}"; do rm -f "$STATE/$f"; done
  rm -f "$STATE"/node[0-9]*.pid "$STATE"/node[0-9]*.err "$STATE"/ctl.pid "$STATE"/ctl.err
  [[ -f "$STATE/munged.pid" ]] && { kill "$(cat "$STATE/munged.pid")" 2>/dev/null || true; rm -f "$STATE/munged.pid"; }
  rm -rf "$STATE/slurm"  # Slurm's config, state and logs: all made by `up --slurm`
  rmdir "$STATE" 2>/dev/null || echo "emulate_cluster: $STATE holds files emulate_cluster.sh did not make; kept" >&2
}

# `ip netns add` that records the name first, so that `down` (and a failed `up`) finds it.
add_netns() {
  echo "$1" >> "$STATE/namespaces"
  ip netns add "$1"
}

# The node-entering agent Open MPI calls as `AGENT HOST CMD...` (like ssh): it enters HOST's
# namespaces and runs CMD with sh -c, as sshd would.
write_agent() {
  cat > "$STATE/agent" <<'EOF'
#!/bin/sh
host="$1"; shift
case "$host" in node[0-9]*) ;; *) echo "emulate_cluster agent: unknown host $host" >&2; exit 255;; esac
pid=$(cat "$(dirname "$0")/$host.pid") || exit 255
exec nsenter -t "$pid" -n -u -m -- sh -c "$*"
EOF
  chmod +x "$STATE/agent"
}

start_node() {  # start_node I SLOTS RATE
  local i=$1 ns; ns=$(node_ns "$1")
  add_netns "$ns"
  ip link add eth0 netns "$ns" type veth peer name "n$i" netns "$SWITCH"
  ip -n "$SWITCH" link set "n$i" master br0 up
  ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev eth0
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
  # TCP gives up on an unanswered send after 5 retransmissions (about 13 s) instead of Linux's 15
  # (about 15 minutes): mpirun notices a node cut off while it was sending to it.
  ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2=5
  shape "$ns" eth0 "$3"
  shape "$SWITCH" "n$i" "$3"
  echo "$SUBNET.$((i + 1)) node$i" >> "$STATE/hosts"
  echo "node$i slots=$2" >> "$STATE/hostfile"
}

# One holder process per node keeps its UTS and mount namespaces: hostname nodeI (HOST), a private
# /dev/shm and the cluster's /etc/hosts; with PRIVATE_TMP=1 a private /tmp too (Slurm's nodes: its
# PMIx plugin makes per-step directories there under names that would collide between nodes).
start_holder() {  # start_holder HOST NETNS [PRIVATE_TMP]
  setsid ip netns exec "$2" unshare --uts --mount --propagation private -- sh -c \
    'hostname "$1" && mount -t tmpfs -o size=4g tmpfs /dev/shm && mount --bind "$2" /etc/hosts &&
     { [ "$3" != 1 ] || mount -t tmpfs -o size=1g tmpfs /tmp; } && exec sleep infinity' \
    sh "$1" "$STATE/hosts" "${3:-0}" </dev/null >/dev/null 2>"$STATE/$1.err" &
  echo $! > "$STATE/$1.pid"
  disown $!  # killed by `down`, never reported as a job of this shell
}

wait_holders() {
  local n=$1 i t
  for (( t = 0; t < 100; t++ )); do
    local ready=1
    for (( i = 0; i < n; i++ )); do
      [[ "$(nsenter -t "$(holder_pid "$i")" -u hostname 2>/dev/null)" == "node$i" ]] || ready=0
    done
    (( ready )) && return 0
    sleep 0.05
  done
  cat "$STATE"/node*.err >&2
  die "the node namespaces did not come up"
}

cmd_up() {
  local n=${1:-}; shift || true
  local slots=1 rate=1gbit slurm=0
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "usage: emulate_cluster.sh up N [--slots K] [--link-rate RATE] [--slurm] (N >= 1 nodes)"
  (( n <= 64 )) || die "at most 64 nodes (asked for $n)"
  while (( $# )); do
    case "$1" in
      --slots) slots=${2:-}; shift 2 || die "--slots needs a value";;
      --link-rate) rate=${2:-}; shift 2 || die "--link-rate needs a value";;
      --slurm) slurm=1; shift;;
      *) die "unknown option '$1' for up";;
    esac
  done
  [[ "$slots" =~ ^[1-9][0-9]*$ ]] || die "--slots '$slots' is not a positive integer"
  check_rate "$rate"
  (( EUID == 0 )) || not_permitted "not root"
  for tool in ip tc unshare nsenter mpirun; do command -v "$tool" >/dev/null || die "'$tool' is not installed"; done
  if (( slurm )); then
    for tool in slurmctld slurmd munged munge srun sbatch scontrol; do
      command -v "$tool" >/dev/null ||
        die "'$tool' is not installed (Debian: slurmctld slurmd slurm-client munge slurm-wlm-basic-plugins; bash scripts/setup.sh --tests installs them)"
    done
  fi
  state_is_ours || die "$STATE holds files emulate_cluster.sh did not make; choose another MFSDP_EMULATE_DIR"
  cmd_down
  probe_facilities
  mkdir -p "$STATE"
  echo "mfsdp emulated cluster $PREFIX" > "$STATE/cluster"
  # From here on an error, INT or TERM removes what was made.
  UP_DONE=0  # global: the EXIT trap runs after this function's scope is gone
  trap '(( UP_DONE )) || { trap - EXIT; cmd_down; }' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  echo "$n" > "$STATE/nodes"
  echo "127.0.0.1 localhost" > "$STATE/hosts"
  : > "$STATE/hostfile"
  add_netns "$SWITCH"
  ip -n "$SWITCH" link add br0 type bridge
  ip -n "$SWITCH" link set br0 up
  local i
  for (( i = 0; i < n; i++ )); do start_node "$i" "$slots" "$rate"; done
  for (( i = 0; i < n; i++ )); do start_holder "node$i" "$(node_ns "$i")" "$slurm"; done
  wait_holders "$n"
  write_agent
  echo "$rate" > "$STATE/rate"
  (( slurm )) && start_slurm "$n" "$slots"
  UP_DONE=1
  trap - EXIT INT TERM
  echo "emulated cluster: $n node(s) x $slots slot(s), links $rate, addresses $SUBNET.1-$n (state in $STATE)"
  (( slurm )) && echo "slurm: controller ctl ($SUBNET.254), partition emu, nodes node[0-$((n - 1))]; jobs: emulate_cluster.sh slurm sbatch|srun|squeue|scontrol ..."
  return 0
}

# ---- Slurm over the nodes (up --slurm) ----------------------------------------------------------
SLURM_CONF_FILE() { echo "$STATE/slurm/slurm.conf"; }

# slurm.conf and cgroup.conf for N nodes of K CPUs. Inside a network namespace slurmd starts only
# with cgroup/v1 named and the plugins that need no cgroup (proctrack/linuxproc, task/none,
# jobacct_gather/none); cred_expire=10 lets a requeued job start again within ~20 s (default 120);
# SlurmdTimeout=10 declares a dead node within ~30 s; ReturnToService=2 takes a node back when its
# slurmd registers again. No accounting daemon: end states go to jobcomp.txt.
write_slurm_conf() {
  local n=$1 k=$2 d="$STATE/slurm" i
  mkdir -p "$d/state"
  for (( i = 0; i < n; i++ )); do mkdir -p "$d/spool/node$i"; done
  {
    echo "ClusterName=mfsdpemu"
    echo "SlurmctldHost=ctl($SUBNET.254)"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "AuthInfo=cred_expire=10"
    echo "MpiDefault=none"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "SwitchType=switch/none"
    echo "SchedulerType=sched/backfill"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    echo "SlurmdParameters=config_overrides"
    echo "StateSaveLocation=$d/state"
    echo "SlurmdSpoolDir=$d/spool/%n"
    echo "SlurmctldPidFile=$d/slurmctld.pid"
    echo "SlurmdPidFile=$d/slurmd.%n.pid"
    echo "SlurmctldLogFile=$d/slurmctld.log"
    echo "SlurmdLogFile=$d/slurmd.%n.log"
    echo "JobCompType=jobcomp/filetxt"
    echo "JobCompLoc=$d/jobcomp.txt"
    echo "SlurmdTimeout=10"
    echo "SlurmctldTimeout=30"
    echo "ReturnToService=2"
    echo "KillWait=5"
    echo "MinJobAge=600"
    echo "MailProg=/bin/true"
    for (( i = 0; i < n; i++ )); do echo "NodeName=node$i NodeAddr=$SUBNET.$((i + 1)) CPUs=$k State=UNKNOWN"; done
    echo "PartitionName=emu Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
  } > "$d/slurm.conf"
  printf 'CgroupPlugin=cgroup/v1\nIgnoreSystemd=yes\n' > "$d/cgroup.conf"
}

# munged on the host serves every namespace (its socket is a path). One that answers is used as it
# is; otherwise one is started here and stopped by `down`.
start_munge() {
  munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
  [[ -f /etc/munge/munge.key ]] || die "munge has no key (/etc/munge/munge.key; Debian's munge package makes one)"
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
  runuser -u munge -- munged || die "munged did not start"
  pgrep -n -u munge -x munged > "$STATE/munged.pid"
  local t
  for (( t = 0; t < 50; t++ )); do
    munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  die "munged does not answer"
}

# The controller's namespace: host ctl at the subnet's .254 on the bridge, unshaped.
start_controller_node() {
  local ns=${PREFIX}-ctl
  add_netns "$ns"
  ip link add eth0 netns "$ns" type veth peer name nctl netns "$SWITCH"
  ip -n "$SWITCH" link set nctl master br0 up
  ip -n "$ns" addr add "$SUBNET.254/24" dev eth0
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
  echo "$SUBNET.254 ctl" >> "$STATE/hosts"
  start_holder ctl "$ns"
}

# A daemon inside host HOST's namespaces, detached (killed by `down` with the namespace's processes).
start_daemon() {  # start_daemon HOST CMD...
  local host=$1; shift
  setsid nsenter -t "$(cat "$STATE/$host.pid")" -n -u -m -- env SLURM_CONF="$(SLURM_CONF_FILE)" "$@" \
    </dev/null >>"$STATE/slurm/$host.daemon.out" 2>&1 &
  disown $!
}

start_slurm() {  # start_slurm N K
  local n=$1 k=$2 i t
  write_slurm_conf "$n" "$k"
  start_munge
  start_controller_node
  local tries
  for (( tries = 0; tries < 100; tries++ )); do
    [[ "$(nsenter -t "$(cat "$STATE/ctl.pid")" -u hostname 2>/dev/null)" == ctl ]] && break
    sleep 0.05
  done
  start_daemon ctl slurmctld -D -f "$(SLURM_CONF_FILE)"
  for (( i = 0; i < n; i++ )); do start_daemon "node$i" slurmd -D -N "node$i" -f "$(SLURM_CONF_FILE)"; done
  # every node idle within 60 s, else the logs say why
  for (( t = 0; t < 600; t++ )); do
    local idle
    idle=$(slurm_on_node0 sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 == "idle"' | wc -l)
    (( idle == n )) && return 0
    sleep 0.1
  done
  tail -5 "$STATE/slurm/slurmctld.log" "$STATE"/slurm/slurmd.node*.log "$STATE"/slurm/*.daemon.out >&2 2>/dev/null || true
  die "Slurm did not bring its $n node(s) to idle within 60 s (logs in $STATE/slurm)"
}

# CMD on node 0 (the login node) with the cluster's SLURM_CONF.
slurm_on_node0() { nsenter -t "$(holder_pid 0)" -n -u -m --wd="$PWD" -- env SLURM_CONF="$(SLURM_CONF_FILE)" "$@"; }

cmd_revive() {
  local i=${1:-}
  check_node "$i"
  [[ -f "$(SLURM_CONF_FILE)" ]] || die "no Slurm in this cluster ('emulate_cluster.sh up N --slurm')"
  start_daemon "node$i" slurmd -D -N "node$i" -f "$(SLURM_CONF_FILE)"
}

cmd_slurm() {
  [[ -f "$(SLURM_CONF_FILE)" ]] || die "no Slurm in this cluster ('emulate_cluster.sh up N --slurm')"
  (( $# )) || die "usage: emulate_cluster.sh slurm CMD... (sbatch, srun, squeue, scontrol, scancel, sinfo)"
  [[ "${1:-}" == "--" ]] && shift
  exec nsenter -t "$(holder_pid 0)" -n -u -m --wd="$PWD" -- env SLURM_CONF="$(SLURM_CONF_FILE)" "$@"
}

# Namespaces and tc tbf, tried in a probe namespace: exit 77 where the kernel does not permit them
# (EPERM, no sch_tbf), exit 1 where they exist but fail.
probe_facilities() {
  local probe=${PREFIX}-probe err
  ip netns delete "$probe" 2>/dev/null || true
  if ! err=$(ip netns add "$probe" 2>&1); then
    [[ "$err" == *"not permitted"* || "$err" == *"Permission denied"* ]] && not_permitted "'ip netns add': $err"
    die "'ip netns add' failed: $err"
  fi
  if ! err=$(ip netns exec "$probe" tc qdisc add dev lo root tbf rate 1gbit burst 32768 latency 10ms 2>&1); then
    ip netns delete "$probe"
    [[ "$err" == *"not permitted"* || "$err" == *"No such file"* || "$err" == *"Unknown qdisc"* ]] &&
      not_permitted "'tc qdisc ... tbf': $err"
    die "'tc qdisc ... tbf' failed: $err"
  fi
  ip netns delete "$probe"
}

# mpirun on node 0: the rsh agent enters the other nodes (no tree spawn: node 0 starts every
# daemon), TCP only on the cluster's subnet, shared memory within a node. TCP keepalive on the
# launcher's own connections (idle 5 s, then 3 probes 2 s apart) makes mpirun notice a node that
# stopped answering within about 11 s and end the job, instead of waiting without end.
cmd_run() {
  [[ "${1:-}" == "--" ]] && shift
  local pid; pid=$(holder_pid 0)
  exec nsenter -t "$pid" -n -u -m --wd="$PWD" -- mpirun --hostfile "$STATE/hostfile" \
    --mca plm_rsh_agent "$STATE/agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include "$SUBNET.0/24" --mca btl_tcp_if_include "$SUBNET.0/24" \
    --mca btl self,vader,tcp \
    --mca oob_tcp_keepalive_time 5 --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 3 "$@"
}

cmd_exec() {
  local i=${1:-}; shift || true
  check_node "$i"
  [[ "${1:-}" == "--" ]] && shift
  (( $# )) || die "usage: emulate_cluster.sh exec I -- CMD..."
  exec nsenter -t "$(holder_pid "$i")" -n -u -m --wd="$PWD" -- "$@"
}

cmd_link() {
  local i=${1:-} what=${2:-}
  check_node "$i"
  case "$what" in
    down) ip -n "$SWITCH" link set "n$i" down ;;
    up) ip -n "$SWITCH" link set "n$i" up ;;
    *) check_rate "$what"; shape "$(node_ns "$i")" eth0 "$what"; shape "$SWITCH" "n$i" "$what" ;;
  esac
}

cmd_kill() {
  local i=${1:-} sig=${2:-KILL} holder
  check_node "$i"
  holder=$(holder_pid "$i")
  ip netns pids "$(node_ns "$i")" | grep -vx "$holder" | xargs -r kill -s "$sig" || true
}

cmd_pids() {
  local i=${1:-}
  check_node "$i"
  ip netns pids "$(node_ns "$i")" | grep -vx "$(holder_pid "$i")" || true
}

cmd_status() {
  local n i; n=$(nodes)
  (( n > 0 )) || { echo "no emulated cluster (state dir $STATE)"; return 0; }
  echo "emulated cluster: $n node(s), state in $STATE"
  for (( i = 0; i < n; i++ )); do
    local state qd
    state=$(ip -n "$SWITCH" -o link show "n$i" | grep -o 'state [A-Z]*' || true)
    qd=$(ip netns exec "$SWITCH" tc qdisc show dev "n$i" | grep -o 'rate [^ ]*' || true)
    echo "  node$i  $SUBNET.$((i + 1))  link $state $qd  processes $(ip netns pids "$(node_ns "$i")" | wc -l)"
  done
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  run) shift; cmd_run "$@" ;;
  exec) shift; cmd_exec "$@" ;;
  link) shift; cmd_link "$@" ;;
  kill) shift; cmd_kill "$@" ;;
  pids) shift; cmd_pids "$@" ;;
  status) cmd_status ;;
  slurm) shift; cmd_slurm "$@" ;;
  revive) shift; cmd_revive "$@" ;;
  *) sed -n '2,39p' "$SELF" | sed 's/^# \{0,1\}//'; [[ -z "${1:-}" || "$1" == -h || "$1" == --help ]] || exit 1 ;;
esac
