#!/bin/sh
# An rsh/ssh stand-in for MPI launchers (Open MPI's plm_rsh_agent, MPICH hydra's
# -launcher-exec): `netns_agent.sh [-x] [-o OPT]... HOST COMMAND...` runs COMMAND (joined by
# spaces and run by sh, as ssh does) in the network and mount namespaces of the process named
# for HOST:
#   URDMA_AGENT_PID_<HOST, every character outside [A-Za-z0-9] as _>=<pid>
# under $URDMA_AGENT_WRAP (e.g. "urdma run": the command and its children then get that
# namespace's urdmad and a device view of their own). A HOST without a process is an error.
while [ $# -gt 0 ]; do
  case $1 in
    -o|-l|-p|-i) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
[ $# -ge 2 ] || { echo "netns_agent.sh: usage: netns_agent.sh HOST COMMAND..." >&2; exit 255; }
host=$1
shift
var=URDMA_AGENT_PID_$(printf '%s' "$host" | tr -c 'A-Za-z0-9' '_')
eval "pid=\${$var:-}"
[ -n "$pid" ] || { echo "netns_agent.sh: no process for host $host ($var)" >&2; exit 255; }
exec nsenter --target "$pid" --net --mount -- ${URDMA_AGENT_WRAP:-} sh -c "$*"
