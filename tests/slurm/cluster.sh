#!/usr/bin/env bash
# Start (or restart) a Perlmutter-shaped Slurm cluster on this one machine, for the tests.
#
# Two nodes, nid001 and nid002, each one slurmd on 127.0.0.1 with its own port. Each node declares
# Perlmutter's GPU-node shape (128 CPUs, 4 GPUs as gres, feature "gpu") through config_overrides, so
# jobs/resnet152.sbatch (-C gpu, -q regular, -A ..., --gpus-per-node=4, --cpus-per-task=32) runs
# unchanged. The "GPUs" are placeholder files: gres bookkeeping only, the tests train on the CPU.
#
# Usage: bash tests/slurm/cluster.sh [start|stop|status]   (needs root; installs Debian's packages if absent)
set -euo pipefail

action=${1:-start}
NODES=(nid001 nid002 nid200)  # two GPU nodes and a CPU node (-C cpu: analysis jobs)
STATE=/var/lib/hpc-test-slurm
CONF=/etc/slurm

log() { printf 'cluster.sh: %s\n' "$*" >&2; }

stop_cluster() {
    pkill -x slurmctld 2>/dev/null || true
    pkill -x slurmd 2>/dev/null || true
    for _ in $(seq 50); do
        pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null || return 0
        sleep 0.2
    done
}

if [ "$action" = stop ]; then stop_cluster; exit 0; fi
if [ "$action" = status ]; then sinfo -N -o '%N %t %c %G %f'; exit 0; fi
if [ "$action" != start ]; then log "unknown action '$action' (start|stop|status)"; exit 2; fi

if [ "$(id -u)" != 0 ]; then log "needs root (to install Slurm and run slurmd)"; exit 3; fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
   || ! command -v sbatch >/dev/null; then
    log "installing slurmctld slurmd slurm-client munge from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q slurmctld slurmd slurm-client munge >/dev/null
fi

stop_cluster
host=$(hostname)

# Node names must resolve: MASTER_ADDR is the first node of the job, and gloo connects to it.
for n in "${NODES[@]}"; do
    grep -qE "^127\.0\.0\.1[[:space:]].*\b$n\b" /etc/hosts || echo "127.0.0.1 $n" >>/etc/hosts
done

# A fresh munge key for this cluster.
mkdir -p /etc/munge /var/log/munge /run/munge /var/lib/munge
if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown -R munge:munge /etc/munge /var/log/munge /run/munge /var/lib/munge 2>/dev/null || true
chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
if ! pgrep -x munged >/dev/null; then
    # --force: the key and dirs may belong to root when no munge user exists.
    munged --force 2>/dev/null || su -s /bin/sh munge -c 'munged --force'
fi

mkdir -p "$CONF" "$STATE/ctld" "$STATE/gres" /var/log/slurm
for n in "${NODES[@]}"; do mkdir -p "$STATE/slurmd/$n"; done
for i in 0 1 2 3; do : >"$STATE/gres/gpu$i"; done

cat >"$CONF/slurm.conf" <<CONFEOF
# Written by tests/slurm/cluster.sh: a two-node Perlmutter-shaped test cluster on one machine.
ClusterName=hpctest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
SlurmctldPort=16817
SlurmdPort=17001
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/slurmd/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
GresTypes=gpu
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# Short timers so failure tests finish quickly.
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=600
MessageTimeout=20
MaxArraySize=1001
NodeName=nid001 NodeHostname=$host NodeAddr=127.0.0.1 Port=17001 CPUs=128 Boards=1 SocketsPerBoard=1 CoresPerSocket=64 ThreadsPerCore=2 RealMemory=229376 Gres=gpu:4 Feature=gpu State=UNKNOWN
NodeName=nid002 NodeHostname=$host NodeAddr=127.0.0.1 Port=17002 CPUs=128 Boards=1 SocketsPerBoard=1 CoresPerSocket=64 ThreadsPerCore=2 RealMemory=229376 Gres=gpu:4 Feature=gpu State=UNKNOWN
NodeName=nid200 NodeHostname=$host NodeAddr=127.0.0.1 Port=17003 CPUs=128 Boards=1 SocketsPerBoard=1 CoresPerSocket=64 ThreadsPerCore=2 RealMemory=229376 Feature=cpu State=UNKNOWN
PartitionName=gpu Nodes=nid001,nid002,nid200 Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
# Stands in for Perlmutter's shared QOS (QOS are not enforced without slurmdbd): jobs of part of a node.
PartitionName=shared Nodes=nid001,nid002 MaxTime=INFINITE State=UP OverSubscribe=YES
CONFEOF

cat >"$CONF/gres.conf" <<GRESEOF
# Placeholder device files: Slurm counts them as GPUs; nothing runs on them.
NodeName=nid001,nid002 Name=gpu File=$STATE/gres/gpu[0-3]
GRESEOF

# 22.05 has no CgroupPlugin=disabled; with no cgroup.conf slurmd loads cgroup/v1 and carries on.
rm -f "$CONF/cgroup.conf"

slurmctld -i
for n in "${NODES[@]}"; do slurmd -N "$n"; done

for _ in $(seq 60); do
    idle=$(sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 ~ /^idle/ {c++} END {print c+0}')
    if [ "$idle" -ge "${#NODES[@]}" ]; then
        log "cluster up: $(sinfo -h -N -o '%N:%t:%c:%G:%f' | sort -u | tr '\n' ' ')"
        exit 0
    fi
    sleep 1
done
log "cluster did not come up; last log lines:"
tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd-*.log >&2 || true
exit 1
