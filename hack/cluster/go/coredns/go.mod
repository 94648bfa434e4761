// Builds CoreDNS with only the plugins the test cluster uses (see main.go). Its own module, because
// CoreDNS pins newer gRPC/otel than k8s.io/kubernetes v1.34.4 and MVS would otherwise move both.
module ddpjob.local/cluster/coredns

go 1.24.0

require github.com/coredns/coredns v1.12.4
