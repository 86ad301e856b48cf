#!/usr/bin/env bash
# Start (or restart) a Perlmutter-shaped Slurm cluster on this one machine, for the tests.
#
# Slurm's accounting as a site runs it: slurmdbd over a real MariaDB, with the accounts and QOS the
# profiles use (ACCOUNTS, QOS below) and AccountingStorageEnforce=associations,limits,qos, so Slurm itself
# refuses a job of an unknown account or QOS, or over its QOS's limits, and sacct answers.
#
# Eight GPU nodes, nid001 to nid008 (a 32-rank job: 8 nodes x 4 tasks), and a CPU node, nid200, each one
# slurmd on 127.0.0.1 with its own port (a slurmd takes ~5 MB: the eight fit). Each GPU node declares
# Perlmutter's GPU-node shape (128 CPUs, 4 GPUs as gres, feature "gpu") through config_overrides, so
# jobs/resnet152.sbatch (-C gpu, -q regular, -A ..., --gpus-per-node=4, --cpus-per-task=32) runs
# unchanged. The "GPUs" are placeholder files: gres bookkeeping only, the tests train on the CPU.
#
# Usage: bash tests/slurm/cluster.sh [start|stop|status]   (needs root; installs Debian's packages if absent)
set -euo pipefail

action=${1:-start}
GPU_NODES=(nid001 nid002 nid003 nid004 nid005 nid006 nid007 nid008)
NODES=("${GPU_NODES[@]}" nid200)  # and a CPU node (-C cpu: analysis jobs)
STATE=/var/lib/hpc-test-slurm
CONF=/etc/slurm
DB_SOCKET=/run/mysqld/mysqld.sock
# Every account a test or a documented command submits with: GPU allocations (_g) and their CPU twins.
ACCOUNTS=(m1234_g m1234 m1_g m1 m0000_g m0000)
# The QOS and the limits the profiles assume (profiles/perlmutter.yaml: regular up to 48 h; shared, part
# of one node; preempt; debug up to 30 min). DenyOnLimit: a job over a limit is refused when submitted.
# Preemption as NERSC's preempt QOS has it: a regular job preempts one of it, which Slurm requeues after
# a grace time (PreemptType=preempt/qos, PreemptMode=REQUEUE below); preempt first, so regular can name it.
QOS=("preempt MaxWall=2-00:00:00 GraceTime=3" "regular MaxWall=2-00:00:00 Preempt=preempt"
     "shared MaxWall=2-00:00:00 MaxTRESPerJob=node=1" "debug MaxWall=00:30:00")

log() { printf 'cluster.sh: %s\n' "$*" >&2; }

stop_cluster() {
    pkill -x slurmctld 2>/dev/null || true
    pkill -x slurmd 2>/dev/null || true
    pkill -x slurmdbd 2>/dev/null || true
    for _ in $(seq 50); do
        pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null || pgrep -x slurmdbd >/dev/null || return 0
        sleep 0.2
    done
}

# MariaDB for slurmdbd: started once and left running across restarts (its data is the accounting).
start_database() {
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
    if ! mariadb-admin --socket="$DB_SOCKET" ping >/dev/null 2>&1; then
        (setsid mariadbd-safe --user=mysql --skip-networking >/dev/null 2>&1 &)
        for _ in $(seq 60); do mariadb-admin --socket="$DB_SOCKET" ping >/dev/null 2>&1 && break; sleep 0.5; done
    fi
    mariadb --socket="$DB_SOCKET" -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
        CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'hpctest';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';" \
        || { log "MariaDB did not start (see /var/lib/mysql/*.err)"; exit 1; }
}

# slurmdbd, then the cluster, its QOS, accounts and root's associations (each kept if already there).
start_accounting() {
    cat >"$CONF/slurmdbd.conf" <<DBDEOF
# Written by tests/slurm/cluster.sh: the test cluster's accounting, in a local MariaDB.
AuthType=auth/munge
DbdHost=localhost
DbdPort=16819
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=hpctest
StorageLoc=slurm_acct_db
PidFile=$STATE/slurmdbd.pid
LogFile=/var/log/slurm/slurmdbd.log
DBDEOF
    chmod 600 "$CONF/slurmdbd.conf"
    slurmdbd
    for _ in $(seq 60); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.5; done
    sacctmgr -n list cluster >/dev/null 2>&1 || { log "slurmdbd did not answer (see /var/log/slurm/slurmdbd.log)"; exit 1; }
    sacctmgr -n -P list cluster format=cluster | grep -qx hpctest || sacctmgr -i add cluster hpctest >/dev/null
    local q name
    for q in "${QOS[@]}"; do
        name=${q%% *}
        sacctmgr -n -P list qos format=name | grep -qx "$name" || sacctmgr -i add qos "$name" >/dev/null
        # shellcheck disable=SC2086  # the limits are words
        sacctmgr -i modify qos where name="$name" set Flags=DenyOnLimit ${q#* } >/dev/null || true
    done
    local all_qos
    all_qos=$(printf '%s\n' "${QOS[@]}" | cut -d' ' -f1 | paste -sd,)
    for a in "${ACCOUNTS[@]}"; do
        sacctmgr -n -P list account format=account | grep -qx "$a" || sacctmgr -i add account "$a" cluster=hpctest >/dev/null
        sacctmgr -n -P list assoc user=root account="$a" format=account | grep -qx "$a" \
            || sacctmgr -i add user root account="$a" cluster=hpctest >/dev/null
        sacctmgr -i modify user where name=root account="$a" set QOS="$all_qos" DefaultQOS=regular >/dev/null || true
    done
    sacctmgr -i modify user where name=root set DefaultAccount="${ACCOUNTS[0]}" >/dev/null || true
}

if [ "$action" = stop ]; then stop_cluster; mariadb-admin --socket="$DB_SOCKET" shutdown 2>/dev/null || true; exit 0; fi
if [ "$action" = status ]; then sinfo -N -o '%N %t %c %G %f'; exit 0; fi
if [ "$action" != start ]; then log "unknown action '$action' (start|stop|status)"; exit 2; fi

if [ "$(id -u)" != 0 ]; then log "needs root (to install Slurm and run slurmd)"; exit 3; fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
   || ! command -v sbatch >/dev/null || ! command -v slurmdbd >/dev/null || ! command -v mariadbd >/dev/null; then
    log "installing slurmctld slurmd slurmdbd slurm-client munge mariadb-server from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q slurmctld slurmd slurmdbd slurm-client munge mariadb-server >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null && apt-get install -y -q slurmctld slurmd slurmdbd slurm-client munge \
             mariadb-server >/dev/null; }
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
# Written by tests/slurm/cluster.sh: an 8-GPU-node Perlmutter-shaped test cluster on one machine.
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
PreemptType=preempt/qos
PreemptMode=REQUEUE
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=16819
AccountingStorageEnforce=associations,limits,qos
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
$(for i in "${!GPU_NODES[@]}"; do echo "NodeName=${GPU_NODES[$i]} NodeHostname=$host NodeAddr=127.0.0.1 Port=$((17001 + i)) CPUs=128 Boards=1 SocketsPerBoard=1 CoresPerSocket=64 ThreadsPerCore=2 RealMemory=229376 Gres=gpu:4 Feature=gpu State=UNKNOWN"; done)
NodeName=nid200 NodeHostname=$host NodeAddr=127.0.0.1 Port=17200 CPUs=128 Boards=1 SocketsPerBoard=1 CoresPerSocket=64 ThreadsPerCore=2 RealMemory=229376 Feature=cpu State=UNKNOWN
PartitionName=gpu Nodes=nid[001-008],nid200 Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
# Where the profiles' shared-QOS jobs (part of a node) sit here (cluster.shared_partition in the tests).
PartitionName=shared Nodes=nid001,nid002 MaxTime=INFINITE State=UP OverSubscribe=YES
CONFEOF

cat >"$CONF/gres.conf" <<GRESEOF
# Placeholder device files: Slurm counts them as GPUs; nothing runs on them.
NodeName=nid[001-008] Name=gpu File=$STATE/gres/gpu[0-3]
GRESEOF

# 22.05 has no CgroupPlugin=disabled; with no cgroup.conf slurmd loads cgroup/v1 and carries on.
rm -f "$CONF/cgroup.conf"

start_database
start_accounting
slurmctld -i
for n in "${NODES[@]}"; do slurmd -N "$n"; done

# A controller restarted from saved state (an interrupted session, a machine image) recovers the jobs it
# had, running on nodes whose processes are gone: the tests want an empty cluster. Cancelling them (not
# slurmctld -c) keeps the job ids counting up, so sacct never holds two jobs of one id.
for _ in $(seq 60); do squeue -h >/dev/null 2>&1 && break; sleep 0.5; done
leftover=$(squeue -h -o %A 2>/dev/null | sort -u | paste -sd' ')
if [ -n "$leftover" ]; then
    log "cancelling jobs recovered from an earlier run of the cluster: $leftover"
    # shellcheck disable=SC2086  # job ids are words
    scancel $leftover || true
fi

for _ in $(seq 60); do
    # sinfo -N lists a node once per partition: count names, and wait for the cancelled jobs to end.
    idle=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u | awk '$2 ~ /^idle/ {c++} END {print c+0}')
    if [ "$idle" -ge "${#NODES[@]}" ] && [ -z "$(squeue -h -o %A 2>/dev/null)" ]; then
        log "cluster up: $(sinfo -h -N -o '%N:%t:%c:%G:%f' | sort -u | tr '\n' ' ')"
        exit 0
    fi
    sleep 1
done
log "cluster did not come up; last log lines:"
tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd-*.log >&2 || true
exit 1
