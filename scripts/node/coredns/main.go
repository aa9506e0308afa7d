// CoreDNS for the test node of `make node-up`, with only the plugins a cluster's DNS needs (the
// kubernetes plugin and what the usual kube-dns Corefile uses), so it builds in a fraction of the
// time of the full plugin set (no cloud SDKs). scripts/controlplane/build.sh makes a module of this
// file requiring github.com/coredns/coredns at $COREDNS_VERSION.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// The plugins' execution order, as in CoreDNS's plugin.cfg (the order matters).
func init() {
	dnsserver.Directives = []string{
		"reload", "ready", "health", "prometheus", "errors", "log", "loadbalance", "cache",
		"hosts", "kubernetes", "loop",
	}
}

func main() {
	coremain.Run()
}
