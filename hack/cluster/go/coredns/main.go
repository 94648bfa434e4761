// CoreDNS with a minimal plugin set: kubernetes (cluster records from Services and EndpointSlices),
// bind (listen on the cluster DNS address only), errors, log, health and ready. No forward plugin: pods
// resolve cluster names only, and no query ever leaves the machine. No cache plugin: a test sees a new
// Service's records at once (a cluster's cache would delay them by its TTL).
package main

import (
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
