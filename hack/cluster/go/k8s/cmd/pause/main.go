// pause: the sandbox ("pause") container's process, as registry.k8s.io/pause's pause.c does it: holds the
// pod's namespaces, reaps orphans (it is PID 1 of the pod when the pod shares its PID namespace) and exits
// on SIGINT/SIGTERM. No registry is reachable here, so the test cluster builds its sandbox image from this.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
