"""A real Kubernetes control plane for the tests, and the node agent that stands in for the kubelet.

``make cluster-up`` / ``make cluster-down`` (or ``hack/cluster/cluster up|down|status``) drive it; the
session fixture in :mod:`fixtures` does the same for pytest. Modules, one concept each:

- ``ddp_operator.api.kubelet``: a container's env and command line, as the kubelet does
- :mod:`podstatus`     pure: Pod status (phase, conditions, container states) from what ran
- :mod:`certs`         CA, serving and client certificates, service-account key (openssl)
- :mod:`layout`        where everything lives under ``.cluster/``, ports, addresses
- :mod:`processes`     start/stop background processes by pid file
- :mod:`controlplane`  etcd, kube-apiserver, kube-controller-manager, kube-scheduler, CoreDNS
- :mod:`netns`         the pod bridge and one network namespace per pod
- :mod:`kubeapi`       a small JSON client on top of the ``kubernetes`` package's kubeconfig loading
- :mod:`nodeagent`     registers Nodes, keeps leases fresh, runs bound pods (:mod:`podrunner`)
- :mod:`kubeletapi`    the HTTPS endpoint the API server calls for ``kubectl logs``
- :mod:`volumes`       a container's volume mounts as bind mounts; :mod:`projected` the files of
  projected/configMap/secret/downwardAPI volumes (the ServiceAccount token, CA and namespace)
- :mod:`images`        ENTRYPOINT and CMD of the project's images, from its Dockerfile
- :mod:`serviceproxy`  the ``kubernetes`` Service's ClusterIP, proxied to the API server for pods
- :mod:`audit`         the API server's audit log: what each ServiceAccount asked for
- :mod:`realnode`      real nodes: a kubelet and a containerd per Node (:mod:`nodeconfig` their
  configuration, :mod:`nodeimages` the sandbox image and image imports, :mod:`realfixture` for tests)
"""
