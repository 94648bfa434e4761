#!/usr/bin/env bash
# A tour of the test cluster with plain kubectl (run after `make cluster-up`): server version, Ready Nodes
# with GPU capacity, a headless Service and two pods where one reaches the other by DNS name over TCP, both
# running to Succeeded, and a deleted namespace taking its pods (and their processes) with it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export KUBECONFIG="$root/.cluster/kubeconfig"
ns="demo-$RANDOM"
step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }

step kubectl version
step kubectl get nodes -o 'custom-columns=NAME:.metadata.name,READY:.status.conditions[?(@.type=="Ready")].status,CPU:.status.capacity.cpu,GPU:.status.capacity.nvidia\.com/gpu'
step kubectl create namespace "$ns"
until kubectl get serviceaccount default -n "$ns" >/dev/null 2>&1; do sleep 0.2; done
printf '\n\033[1m$ kubectl apply --server-side -n %s -f - (Service svc, pods a and b)\033[0m\n' "$ns"
kubectl apply --server-side -n "$ns" -f - <<'YAML'
apiVersion: v1
kind: Service
metadata: {name: svc}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector: {app: demo}
  ports: [{name: tcp, port: 8080}]
---
apiVersion: v1
kind: Pod
metadata: {name: a, labels: {app: demo}}
spec:
  hostname: a-host
  subdomain: svc
  restartPolicy: Never
  containers:
  - name: server
    image: python:3.11
    command: [python, -c]
    args:
    - |
      import socket
      s = socket.create_server(("", 8080)); c, peer = s.accept()
      c.sendall(f"hello from {socket.gethostname()} ({socket.gethostbyname(socket.gethostname())}) to {peer[0]}".encode())
---
apiVersion: v1
kind: Pod
metadata: {name: b}
spec:
  restartPolicy: Never
  affinity:
    podAntiAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
      - {labelSelector: {matchLabels: {app: demo}}, topologyKey: kubernetes.io/hostname}
  containers:
  - name: client
    image: python:3.11
    env: [{name: TARGET, value: a-host.svc}]
    command: [python, -c]
    args:
    - |
      import os, socket, time
      for _ in range(300):
          try:
              print(socket.create_connection((os.environ["TARGET"], 8080), timeout=2).recv(200).decode()); break
          except OSError:
              time.sleep(0.2)
      else:
          raise SystemExit("no answer")
YAML
step kubectl wait -n "$ns" pod/a pod/b --for=jsonpath='{.status.phase}'=Succeeded --timeout=120s
step kubectl get pods -n "$ns" -o wide
step kubectl logs -n "$ns" b
printf '\n\033[1m$ kubectl run sleeper (a long-running pod), then delete the namespace\033[0m\n'
kubectl run sleeper -n "$ns" --image=python:3.11 --restart=Never --command -- python -c 'import time; time.sleep(600)'
kubectl wait -n "$ns" pod/sleeper --for=condition=Ready --timeout=60s
pid="$(kubectl get pod -n "$ns" sleeper -o jsonpath='{.status.containerStatuses[0].containerID}')"; pid="${pid##*/}"
echo "sleeper runs as pid $pid: $(tr '\0' ' ' < /proc/"$pid"/cmdline)"
step kubectl delete namespace "$ns" --wait=true --timeout=120s
if [[ -e /proc/$pid ]]; then echo "FAIL: pid $pid still running"; exit 1; else echo "pid $pid is gone"; fi
