#!/usr/bin/env bash
# Slurm's srun -n 2 starts dgemma-run train's two ranks (they read SLURM_PROCID, SLURM_NTASKS,
# SLURM_LOCALID and meet at the first host of SLURM_JOB_NODELIST, MASTER_PORT): the metrics equal
# dgemma-run --nproc-per-node 2's on the same plan and seed; the run-level lines appear once and the
# log holds no carriage return.
#
# The test runs its own one-node cluster, in its scratch directory, and stops it on every exit
# path: a munge key and munged on their own socket, a slurm.conf naming this host (as `slurmd -C`
# describes it) with free ports for slurmctld and slurmd, then slurmctld -D and slurmd -D. slurmd
# must run as root (it starts each task as the job's user), so without root the test skips (exit
# 77, ctest's SKIP_RETURN_CODE) and says why.
#   srun.sh SOURCE_DIR BIN_DIR
# shellcheck source=test/launchers/lib.sh
source "$(dirname "$0")/lib.sh"

[[ $(id -u) -eq 0 ]] || skip "starting a private Slurm cluster (munged, slurmctld, slurmd) needs root; run as root to test srun"
for tool in munged slurmctld slurmd srun sinfo scontrol; do
  command -v "$tool" > /dev/null ||
    fail "$tool not found (Debian: munge, slurmctld, slurmd, slurm-client; scripts/install-deps.sh installs them)"
done
steps=4

compile_plan
run_reference --steps "$steps" --metrics "$scratch/reference.jsonl"

# ---- the cluster ----
cluster=$scratch/slurm
mkdir -p "$cluster/state" "$cluster/spool" "$cluster/munge"
chmod 700 "$cluster/munge"
# A process this script started, stopped on exit: SIGTERM, then SIGKILL if it is still there.
stop_daemon() {
  local pid=$1 name=$2
  kill -0 "$pid" 2> /dev/null || return 0
  kill -TERM "$pid" 2> /dev/null || true
  for _ in $(seq 50); do
    kill -0 "$pid" 2> /dev/null || { log "stopped $name (pid $pid)"; return 0; }
    sleep 0.1
  done
  kill -KILL "$pid" 2> /dev/null || true
  log "killed $name (pid $pid)"
}
show_cluster_logs() {
  local file
  for file in "$cluster"/*.log "$cluster"/*.out; do [[ -s $file ]] && show_log "$(basename "$file")" "$file"; done
}

dd if=/dev/urandom of="$cluster/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$cluster/munge/munge.key"
munge_socket=$cluster/munge/munge.socket
# Every daemon runs in the foreground as this script's child, so that even a kill of the whole
# process tree (ctest's timeout) stops it. --force: the key and directories belong to root, not to
# a munge user.
munged --foreground --force --key-file "$cluster/munge/munge.key" --socket "$munge_socket" \
  --pid-file "$cluster/munge/munged.pid" --log-file "$cluster/munged.log" --seed-file "$cluster/munge/munged.seed" \
  > "$cluster/munged.out" 2>&1 &
munged_pid=$!
on_exit 'stop_daemon $munged_pid munged'
for _ in $(seq 100); do
  [[ -S $munge_socket ]] && break
  kill -0 $munged_pid 2> /dev/null || { show_cluster_logs; fail "munged exited while starting"; }
  sleep 0.1
done
[[ -S $munge_socket ]] || { show_cluster_logs; fail "munged made no socket at $munge_socket"; }

host=$(hostname -s)
# This machine as slurmd sees it (CPUs, sockets, cores, memory), so the node is never refused for
# a configuration that promises more than it has.
node_line=$(slurmd -C | grep '^NodeName=') || fail "slurmd -C did not describe this machine"
cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<< "$node_line")
((cpus >= 2)) || skip "this machine has $cpus CPU(s); srun -n 2 needs two"
ctld_port=$(free_port)
slurmd_port=$(free_port)
while [[ $slurmd_port == "$ctld_port" ]]; do slurmd_port=$(free_port); done
export SLURM_CONF=$cluster/slurm.conf
cat > "$SLURM_CONF" << EOF
ClusterName=dgemmatest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$munge_socket
StateSaveLocation=$cluster/state
SlurmdSpoolDir=$cluster/spool
SlurmctldPidFile=$cluster/slurmctld.pid
SlurmdPidFile=$cluster/slurmd.pid
SlurmctldLogFile=$cluster/slurmctld.log
SlurmdLogFile=$cluster/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
ReturnToService=2
${node_line% UpTime=*} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=dgemma Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
log "slurm.conf: node '${node_line% UpTime=*}', slurmctld on port $ctld_port, slurmd on port $slurmd_port"

slurmctld -D -i -f "$SLURM_CONF" > "$cluster/slurmctld.out" 2>&1 &
ctld_pid=$!
on_exit 'stop_daemon $ctld_pid slurmctld'
slurmd -D -f "$SLURM_CONF" > "$cluster/slurmd.out" 2>&1 &
slurmd_pid=$!
on_exit 'stop_daemon $slurmd_pid slurmd'

state=
for _ in $(seq 300); do
  state=$(sinfo -h -n "$host" -o %T 2> /dev/null || true)
  [[ $state == idle ]] && break
  kill -0 $ctld_pid 2> /dev/null || { show_cluster_logs; fail "slurmctld exited while starting"; }
  kill -0 $slurmd_pid 2> /dev/null || { show_cluster_logs; fail "slurmd exited while starting"; }
  sleep 0.1
done
[[ $state == idle ]] || { show_cluster_logs; fail "the node did not become idle in 30 s (sinfo says '$state')"; }
log "one-node Slurm cluster up: node $host idle"

# ---- the run ----
# The ranks meet at the job's first host, this one by name; MASTER_ADDR stays unset, as on a
# cluster, unless the name does not resolve here.
unset MASTER_ADDR
if ! getent hosts "$host" > /dev/null; then
  export MASTER_ADDR=127.0.0.1
  log "NOTE: this host's name '$host' does not resolve, so the ranks meet at MASTER_ADDR=$MASTER_ADDR instead" \
    "of the first host of SLURM_JOB_NODELIST"
fi
MASTER_PORT=$(free_port)
export MASTER_PORT
train_args --steps "$steps" --metrics "$scratch/srun.jsonl"
run_logged "$scratch/srun.log" "$phase_seconds" srun -n 2 --ntasks-per-node 2 --export=ALL --mpi=none "${train_args_[@]}"
show_log "srun output" "$scratch/srun.log"
((run_status == 0)) || { show_cluster_logs; fail "srun exited $run_status"; }

compare_metrics "$scratch/reference.jsonl" "$scratch/srun.jsonl" "$steps"
expect_once "$scratch/srun.log" "defaults of the plan's preset"
expect_no_carriage_return "$scratch/srun.log"
pass_if_no_problems "srun -n 2 trained the same $steps steps as dgemma-run --nproc-per-node 2"
