#!/bin/bash
# Runs inside the rxe-vm guest (../shared/tools/rxe-vm), started by scripts/rxe-interop.
# rxe0 (kernel rxe, rdma-core's libibverbs) on veth0 = 198.18.0.1 in the initial namespace;
# softhca0 (softhca's drop-in libibverbs, and librdmacm for the rdma_cm cases) on veth1 =
# 198.18.0.2 in namespace "sh". Every case runs a server on one side and a client on the
# other, with tcpdump on veth0, and leaves in $OUT/cases/NAME/ its commands, both logs and
# exit codes, and in $OUT/pcap/NAME.pcap the wire.
#
# Usage: guest.sh [--quick | --speed] [--only REGEX] [--rmem-max BYTES]
# --speed: instead of the matrix, issue 12's same-guest speed comparison: perftest between
# rxe0 and rxe1 over the veth pair, then between two softhca processes (a namespace's
# loopback), in the same boot; logs in $OUT/speed/.
# Env from the harness: SHCA (dir of the drop-in libraries), TOOLS (dir of rdma_check),
# SHCA_ENV (extra VAR=VALUE words for softhca's side of every case).
# --rmem-max sets net.core.rmem_max, which caps the SO_RCVBUF softhca asks for (8 MiB) without
# SO_RCVBUFFORCE; the kernel's default, 212992, is what an unconfigured host gives it.
set -u
QUICK=0; SPEED=0; ONLY=.; RMEM=
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=1 ;;
    --speed) SPEED=1 ;;
    --only) ONLY=$2; shift ;;
    --rmem-max) RMEM=$2; shift ;;
    *) echo "guest.sh: unknown argument $1"; exit 2 ;;
  esac
  shift
done
SHCA=${SHCA:-/host/bin/shca}
TOOLS=${TOOLS:-/host/bin/interop}
A=198.18.0.1; B=198.18.0.2
T=${CASE_TIMEOUT:-150}
MAXPKT=${MAXPKT:-60000}
STALL_AFTER=${STALL_AFTER:-20}
mkdir -p "$OUT/cases" "$OUT/pcap" /tmp/cap
[ -n "$RMEM" ] && sysctl -qw net.core.rmem_max="$RMEM"

# ------------------------------------------------------------------ speed (issue 12, item 4)
if [ $SPEED = 1 ]; then
  mkdir -p "$OUT/speed"
  { echo "kernel=$(uname -r)"; dpkg-query -W -f='${Package}=${Version}\n' rdma-core perftest 2>/dev/null; } >"$OUT/versions.txt"
  rxe-setup.sh pair 9000 || exit 1
  ip netns add sp
  ip -n sp link set lo up
  # speed NAME SERVER... -- CLIENT...: perftest server in the background, then its client
  speed() {
    local name=$1 srv=() cli=() sp crc src
    shift
    while [ "$1" != -- ]; do srv+=("$1"); shift; done
    shift; cli=("$@")
    timeout 120 "${srv[@]}" >"$OUT/speed/$name.server.log" 2>&1 & sp=$!
    sleep 2
    timeout 120 "${cli[@]}" >"$OUT/speed/$name.client.log" 2>&1; crc=$?
    wait $sp; src=$?
    echo "speed $name: client rc=$crc server rc=$src"
  }
  SP=(ip netns exec sp env "LD_LIBRARY_PATH=$SHCA")
  BW=(ib_write_bw -F -s 65536 -D 4)
  LAT=(ib_send_lat -F -s 8 -n 2000)
  # The shared-memory link (issue 13) runs the same perftest, the rings in /dev/shm.
  mountpoint -q /dev/shm || { mkdir -p /dev/shm && mount -t tmpfs -o mode=1777 tmpfs /dev/shm; }
  # Each case SPEED_REPS times, the rounds interleaved (rxe, then every softhca mode, again):
  # one run's softhca figure moved by half between runs of one boot, rxe's by a few percent;
  # a latency run moves by a tenth either way, so a median of three swung the latency ratio
  # across 0.5x from boot to boot (0.48-0.54x on one day), five take the middle of more.
  for rep in $(seq "${SPEED_REPS:-5}"); do
    speed "rxe.write_bw.$rep" "${BW[@]}" -d rxe1 -x 1 -- "${BW[@]}" -d rxe0 -x 1 198.18.0.2
    speed "rxe.send_lat.$rep" "${LAT[@]}" -d rxe1 -x 1 -- "${LAT[@]}" -d rxe0 -x 1 198.18.0.2
    for link in udp shm; do
      for mode in 0 1; do
        S=("${SP[@]}" "SOFTHCA_BUSY_POLL=$mode" "SOFTHCA_LINK=$link")
        who=softhca.busy$mode
        [ $link = shm ] && who=softhca.shm.busy$mode
        speed "$who.write_bw.$rep" "${S[@]}" SOFTHCA_ADDR=127.0.0.2 "${BW[@]}" -x 0 -- \
          "${S[@]}" SOFTHCA_ADDR=127.0.0.3 "${BW[@]}" -x 0 127.0.0.2
        speed "$who.send_lat.$rep" "${S[@]}" SOFTHCA_ADDR=127.0.0.2 "${LAT[@]}" -x 0 -- \
          "${S[@]}" SOFTHCA_ADDR=127.0.0.3 "${LAT[@]}" -x 0 127.0.0.2
      done
    done
  done
  exit 0
fi

# ------------------------------------------------------------------ network
# rxe-setup.sh single: veth0/veth1, the policy routes that keep 198.18.0.1 <-> .2 on the
# wire, rxe0 on veth0. Then veth1 moves into the namespace softhca runs in.
rxe-setup.sh single 9000 || exit 1
ip netns add sh
ip link set veth1 netns sh
ip -n sh link set lo up
ip -n sh link set veth1 mtu 9000 up
ip -n sh addr add $B/32 dev veth1
ip -n sh route add $A dev veth1
ip -n sh neigh replace $A lladdr 02:00:00:00:00:01 dev veth1 nud permanent
# softhca sends UDP GSO messages; with UDP segmentation off on veth1 the kernel splits them at
# the segment size before the wire, as a NIC would, so rxe and the capture see single packets.
ip netns exec sh ethtool -K veth1 tx-udp-segmentation off >/dev/null
# softhca's counters go to stderr when a program exits with its device open (a failure,
# mostly): they say whether its engine kept up.
# shellcheck disable=SC2206
SH=(ip netns exec sh env "LD_LIBRARY_PATH=$SHCA" "SOFTHCA_ADDR=$B" SOFTHCA_STATS=1 ${SHCA_ENV:-})

{
  echo "kernel=$(uname -r)"
  echo "debian=$(cat /etc/debian_version)"
  dpkg-query -W -f='${Package}=${Version}\n' rdma-core ibverbs-providers libibverbs1 librdmacm1 rdmacm-utils perftest
  echo "net.core.rmem_max=$(sysctl -n net.core.rmem_max)"
  echo "rxe0_gid1=$(cat /sys/class/infiniband/rxe0/ports/1/gids/1)"
  echo "rxe0_active_mtu=$(ibv_devinfo -d rxe0 | awk '/active_mtu/{print $2}')"
  echo "softhca0_active_mtu=$("${SH[@]}" ibv_devinfo -d softhca0 2>/dev/null | awk '/active_mtu/{print $2}')"
} >"$OUT/versions.txt" 2>&1
cat "$OUT/versions.txt"

# ------------------------------------------------------------------ one case
# side_cmd SIDE PROG: the command prefix and device options for PROG on SIDE (rxe|sh)
side_cmd() {
  local side=$1 prog=$2 gflag=-g
  case $prog in ib_*) gflag=-x ;; esac
  if [ "$side" = rxe ]; then
    CMD=("$prog" -d rxe0 "$gflag" 1)
  else
    CMD=("${SH[@]}" "$prog" -d softhca0 "$gflag" 0)
  fi
}
listening() {  # listening SIDE PORT [SERVER_LOG]: with a log, an rdma_cm listener
  if [ "$2" = join ]; then  # a multicast receiver (mckey) has joined its group
    grep -q "joined dgid" "$3"
  elif [ $# -lt 3 ]; then
    if [ "$1" = rxe ]; then ss -ltnH "sport = :$2" | grep -q .
    else ip netns exec sh ss -ltnH "sport = :$2" | grep -q .; fi
  elif [ "$1" = rxe ]; then  # the kernel's rdma_cm ids (iproute2's rdma tool)
    rdma resource show cm_id 2>/dev/null | grep LISTEN | grep -q ":$2 "
  else  # softhca's CM says it (SOFTHCA_CM_DEBUG=1)
    grep -q "listening on port $2 " "$3"
  fi
}
udp_drops() {  # UDP datagrams the kernel dropped for a full receive buffer in softhca's namespace
  # shellcheck disable=SC2016
  ip netns exec sh awk '/^Udp:/{if(!h){for(i=2;i<=NF;i++)if($i=="RcvbufErrors")c=i;h=1}else print $c}' \
    /proc/net/snmp
}
netem() {  # netem "ARGS" | netem off: both ends of the veth
  if [ "$1" = off ]; then
    tc qdisc del dev veth0 root 2>/dev/null; ip netns exec sh tc qdisc del dev veth1 root 2>/dev/null
  else
    # shellcheck disable=SC2086
    tc qdisc add dev veth0 root netem $1 && ip netns exec sh tc qdisc add dev veth1 root netem $1
  fi
}

# stall_probe DIR: what softhca's processes are doing, for a case still running after
# STALL_AFTER seconds (and again 1 s later: CPU time that grew means a busy thread, a syscall
# that stayed means a blocked one): per thread its name, state, CPU ticks, schedstat (ns on
# the CPU / ns waiting for one / timeslices) and the system call it is in (/proc/TID/syscall:
# number and arguments), and softhca's UDP sockets with their queues (ss -m: r = bytes
# queued, rb = the buffer's limit).
stall_probe() {
  local d=$1 pid t
  for round in 1 2; do
    {
      echo "== $(date +%T.%N) round $round"
      for pid in $(ip netns pids sh); do
        echo "pid $pid: $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)"
        for t in /proc/"$pid"/task/*; do
          # shellcheck disable=SC2046
          set -- $(sed 's/.*) //' "$t/stat" 2>/dev/null)
          echo "  tid ${t##*/} $(cat "$t/comm" 2>/dev/null) state=${1:-?} utime=${12:-?} stime=${13:-?} schedstat=$(cat "$t/schedstat" 2>/dev/null | tr ' ' /) syscall=$(cat "$t/syscall" 2>/dev/null) wchan=$(cat "$t/wchan" 2>/dev/null)"
        done
      done
      ip netns exec sh ss -uanmp 2>/dev/null
      ip netns exec sh awk '/^Udp:/' /proc/net/snmp
    } >>"$d/stall.txt" 2>&1
    sleep 1
  done
}
# tc NAME SERVER_SIDE PROG "ARGS" [NETEM] [PORT]: the client runs on the other side
tcase() {
  local name=$1 ss=$2 prog=$3 args=$4 nem=${5:-} port=${6:-18515} cs sip
  [[ $name =~ $ONLY ]] || return 0
  if [ "$ss" = rxe ]; then cs="sh"; sip=$A; else cs="rxe"; sip=$B; fi
  side_cmd "$ss" "$prog"; scmd=("${CMD[@]}")
  side_cmd "$cs" "$prog"; ccmd=("${CMD[@]}")
  # shellcheck disable=SC2206
  local a=($args)
  scmd+=("${a[@]}"); ccmd+=("${a[@]}" "$sip")
  # tcpdump in the emulated guest sometimes falls behind a burst and drops packets; a case
  # whose programs passed but whose capture is incomplete cannot have every ICRC checked,
  # and is run again (at most 3 times in all).
  local attempt
  for attempt in 1 2 3; do
    runcase "$name" "$ss" "$cs" "$port" "$nem" tcp
    echo "attempts=$attempt" >>"$OUT/cases/$name/rc.txt"
    grep -q '^server_rc=0$' "$OUT/cases/$name/rc.txt" && grep -q '^client_rc=0$' "$OUT/cases/$name/rc.txt" \
      && grep -q '^capture_dropped=[1-9]' "$OUT/cases/$name/rc.txt" || break
    echo "case $name: passed, but tcpdump dropped packets; again"
  done
}
# cmcase NAME SERVER_SIDE PORT PROG "SERVER ARGS" "CLIENT ARGS": an rdma_cm program (librdmacm:
# rdma-core's on rxe, softhca's drop-in on softhca), which finds its device by address; @S in
# the arguments is the server's address. softhca's side logs its CM steps (SOFTHCA_CM_DEBUG=1),
# and the client starts once the server's rdma_cm id listens on PORT.
cmcase() {
  local name=$1 ss=$2 port=$3 prog=$4 sargs=$5 cargs=$6 cs sip cip
  [[ $name =~ $ONLY ]] || return 0
  if [ "$ss" = rxe ]; then cs="sh"; sip=$A; cip=$B; else cs="rxe"; sip=$B; cip=$A; fi
  sargs=${sargs//@C/$cip}; cargs=${cargs//@C/$cip}
  # shellcheck disable=SC2206
  local sa=(${sargs//@S/$sip}) ca=(${cargs//@S/$sip})
  cm_cmd "$ss" "$prog"; scmd=("${CMD[@]}" "${sa[@]}")
  cm_cmd "$cs" "$prog"; ccmd=("${CMD[@]}" "${ca[@]}")
  # perftest's -R sets up its test QPs on a second listener after the control connection;
  # a client whose second REQ comes before that listen is refused (REJ reason 8, on Linux
  # too) and perftest 4.5 gives up (its retry then uses ids it has freed). Such a run is run
  # again, at most 3 times in all, as crates/softhca-rdmacm/tests/common does.
  local attempt
  for attempt in 1 2 3; do
    runcase "$name" "$ss" "$cs" "$port" "" cm
    echo "attempts=$attempt" >>"$OUT/cases/$name/rc.txt"
    grep -q "RDMA_CM_EVENT_REJECTED; error: 8" "$OUT/cases/$name/client.log" || break
    echo "case $name: the client's second REQ came before the server's second listen; again"
  done
}
cm_cmd() {  # cm_cmd SIDE PROG: perftest (-R) still names its device; rping & co. do not
  local side=$1 prog=$2
  if [ "$side" = rxe ]; then CMD=("$prog"); else CMD=("${SH[@]}" SOFTHCA_CM_DEBUG=1 "$prog"); fi
  case $prog in
    ib_*) if [ "$side" = rxe ]; then CMD+=(-d rxe0); else CMD+=(-d softhca0); fi ;;
    # its "joined" line is the receiver's readiness: line-buffered into the log
    mckey) CMD=(stdbuf -oL "${CMD[@]}") ;;
  esac
}
# runcase NAME SERVER_SIDE CLIENT_SIDE PORT NETEM READY: runs scmd, then ccmd once the server
# listens on PORT (READY: tcp, perftest's and the pingpongs' side channel; cm, an rdma_cm id)
runcase() {
  local name=$1 ss=$2 cs=$3 port=$4 nem=$5 ready=$6 d tp sp src crc t0 t1 drops0 probe
  d=$OUT/cases/$name; mkdir -p "$d"
  printf 'server (%s): %s\nclient (%s): %s\nnetem: %s\n' "$ss" "${scmd[*]}" "$cs" "${ccmd[*]}" \
    "${nem:-none}" >"$d/cmd.txt"
  [ -n "$nem" ] && netem "$nem"
  # to tmpfs with a 256 MiB ring (writing through 9p loses packets), moved to $OUT afterwards;
  # at most MAXPKT packets, so that a retransmission storm cannot fill the guest's memory
  tcpdump -i veth0 -n -U --immediate-mode -B 262144 -s 0 -c "$MAXPKT" -w "/tmp/cap/$name.pcap" 'udp port 4791' \
    2>"$d/tcpdump.log" & tp=$!
  for _ in $(seq 50); do grep -q listening "$d/tcpdump.log" && break; sleep 0.1; done
  drops0=$(udp_drops)
  t0=$(date +%s.%N)
  timeout "$T" "${scmd[@]}" >"$d/server.log" 2>&1 & sp=$!
  for _ in $(seq 200); do
    if [ "$ready" = cm ]; then listening "$ss" "$port" "$d/server.log" && break
    else listening "$ss" "$port" && break; fi
    sleep 0.1
  done
  (sleep "$STALL_AFTER"; stall_probe "$d") & probe=$!
  timeout "$T" "${ccmd[@]}" >"$d/client.log" 2>&1; crc=$?
  wait $sp; src=$?
  kill $probe 2>/dev/null; wait $probe 2>/dev/null
  t1=$(date +%s.%N)
  sleep 0.5
  kill -INT $tp 2>/dev/null; wait $tp
  [ -n "$nem" ] && netem off
  printf 'server_rc=%s\nclient_rc=%s\nserver_side=%s\nseconds=%s\nsofthca_udp_drops=%s\n' \
    "$src" "$crc" "$ss" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')" \
    "$(( $(udp_drops) - drops0 ))" >"$d/rc.txt"
  echo "capture_dropped=$(awk '/dropped by kernel/{print $1}' "$d/tcpdump.log")" >>"$d/rc.txt"
  echo "capture_truncated=$(awk -v m="$MAXPKT" '/packets captured/{print ($1 >= m)}' "$d/tcpdump.log")" >>"$d/rc.txt"
  mv "/tmp/cap/$name.pcap" "$OUT/pcap/"
  echo "case $name: server($ss) rc=$src client($cs) rc=$crc"
}
# both NAME PROG "ARGS" [NETEM] [PORT]: the case with rxe as server, then with softhca as server
both() {
  local name=$1; shift
  tcase "$name.rxe-srv" rxe "$@"
  tcase "$name.shca-srv" sh "$@"
}
# cm NAME PORT PROG "SERVER ARGS" "CLIENT ARGS": the rdma_cm case both ways
cm() {
  local name=$1; shift
  cmcase "$name.rxe-srv" rxe "$@"
  cmcase "$name.shca-srv" sh "$@"
}
# the rdma_cm cases (issue 14): rdmacm-utils 44 and perftest's -R, each a few seconds; rping
# and udaddy listen on port 7174, ucmatose on 7471, perftest on 18515. perftest gets -F as in
# the verbs cases but no -x: rdma_cm picks the GID from the address. mckey's receiver joins a
# multicast group (its "joined" line is its readiness) and its sender, bound to its own
# address (@C), sends it 20 datagrams. rstream runs rsockets (librdmacm's socket API over RC:
# RDMA Writes with Immediate into buffers the peer offers), every byte verified (-T v), in
# transfers of 100,000 bytes, larger than half the default 128 KiB receive buffer, and again
# with -T a (rpoll with a timeout of 0 before each call: a POLLHUP beside its last data is an
# error to rstream); riostream
# the same through riomap/riowrite (RDMA Writes into a buffer the peer mapped, each side
# polling its buffer's last byte). cm_matrix quick: the subset of --quick (perftest only in
# the full matrix).
cm_matrix() {
  cm cm.rping 7174 rping "-s -a @S -C 50 -v" "-c -a @S -C 50 -v"
  cm cm.ucmatose 7471 ucmatose "-b @S -c 2" "-s @S -c 2"
  cm cm.udaddy 7174 udaddy "-b @S" "-s @S"
  cm cm.mckey join mckey "-m 239.1.2.3 -b @S -C 20" "-m 239.1.2.3 -b @C -C 20 -s"
  cm cm.rstream 7471 rstream "-b @S -T v -S 100000 -C 50" "-s @S -T v -S 100000 -C 50"
  cm cm.rstream-async 7471 rstream "-b @S -T a -S 100000 -C 50" "-s @S -T a -S 100000 -C 50"
  cm cm.riostream 7471 riostream "-b @S -T v -S 100000 -C 20" "-s @S -T v -S 100000 -C 20"
  [ "${1:-}" = quick ] && return 0
  cm cm.write_bw 18515 ib_write_bw "-F -R -n 200 -s 65536" "-F -R -n 200 -s 65536 @S"
  cm cm.send_lat 18515 ib_send_lat "-F -R -n 200" "-F -R -n 200 @S"
  cm cm.read_bw 18515 ib_read_bw "-F -R -n 200" "-F -R -n 200 @S"
}
RC="$TOOLS/rdma_check"
chk() {  # chk NAME "ARGS" [NETEM]
  both "$1" "$RC" "$2" "${3:-}" 18600
}

# ------------------------------------------------------------------ the matrix
if [ $QUICK = 1 ]; then
  both rc_pingpong.m1024 ibv_rc_pingpong "-m 1024 -n 50"
  both ud_pingpong ibv_ud_pingpong "-n 50"
  both write_bw ib_write_bw "-F -s 65536 -n 50"
  chk ops.m4096 "-t ops -m 4096"
  chk stream.loss2 "-t stream -m 4096 -n 32" "loss 2%"
  chk badrkey "-t badrkey"
  cm_matrix quick
  exit 0
fi

# Debian's ibverbs-utils: default and large sizes, path MTU 1024 and 4096 (veth MTU 9000)
for m in 1024 4096; do
  both rc_pingpong.m$m ibv_rc_pingpong "-m $m -n 100"
  both rc_pingpong.m$m.s65536 ibv_rc_pingpong "-m $m -n 20 -s 65536"
  both uc_pingpong.m$m ibv_uc_pingpong "-m $m -n 100"
  both uc_pingpong.m$m.s65536 ibv_uc_pingpong "-m $m -n 20 -s 65536"
  both srq_pingpong.m$m ibv_srq_pingpong "-m $m -n 100"
  both srq_pingpong.m$m.s65536 ibv_srq_pingpong "-m $m -n 20 -s 65536"
done
# ibv_ud_pingpong has no -m: its messages follow the port's active MTU (4096 here); for MTU
# 1024 both ends of the veth go to 1500 bytes for the case (rxe0 follows its netdev, softhca
# reads the interface's MTU when the program opens the device), then back to 9000
both ud_pingpong ibv_ud_pingpong "-n 100"
both ud_pingpong.s4096 ibv_ud_pingpong "-n 50 -s 4096"
veth_mtu() { ip link set veth0 mtu "$1"; ip -n sh link set veth1 mtu "$1"; }
if [[ ud_pingpong.m1024.rxe-srv =~ $ONLY || ud_pingpong.m1024.shca-srv =~ $ONLY ]]; then
  veth_mtu 1500
  both ud_pingpong.m1024 ibv_ud_pingpong "-n 100 -s 1024"
  veth_mtu 9000
fi

# perftest 4.5 (RoCE v2 GID index with -x)
both write_bw ib_write_bw "-F -s 65536 -n 100"
both write_bw.m1024 ib_write_bw "-F -s 65536 -n 100 -m 1024"
both read_bw ib_read_bw "-F -s 65536 -n 100"
both send_bw ib_send_bw "-F -s 65536 -n 100"
both atomic_bw.faa ib_atomic_bw "-F -n 200 -A FETCH_AND_ADD"
both atomic_bw.cas ib_atomic_bw "-F -n 200 -A CMP_AND_SWAP"
both write_lat ib_write_lat "-F -s 8 -n 100"
both read_lat ib_read_lat "-F -s 8 -n 100"
both send_lat ib_send_lat "-F -s 8 -n 100"
both atomic_lat ib_atomic_lat "-F -n 100"

# rdma_check: Write/Read/atomics/immediates with data checks, the error paths, recovery
chk ops.m1024 "-t ops -m 1024"
chk ops.m4096 "-t ops -m 4096"
chk badrkey "-t badrkey"
chk rnr0 "-t rnr0"
chk rnr7 "-t rnr7"
chk errmid "-t errmid -n 40"
chk destroy "-t destroy -n 40"
chk stream "-t stream -m 4096 -n 32"
chk stream.loss2 "-t stream -m 4096 -n 32" "loss 2%"
chk stream.loss10 "-t stream -m 4096 -n 32" "loss 10%"
chk stream.m1024.loss2 "-t stream -m 1024 -n 32" "loss 2%"
chk stream.dup-reorder "-t stream -m 4096 -n 32" "delay 2ms reorder 25% 50% duplicate 5%"

# rdma_cm (rping, ucmatose, udaddy, perftest -R)
cm_matrix
exit 0
