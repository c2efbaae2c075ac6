// CoreDNS with the plugins a cluster DNS uses (kubeadm's and kind's Corefile, plus log,
// hosts, rewrite, autopath and whoami), composed the way CoreDNS documents for builds with
// a chosen plugin set: import the plugins, list their directives in CoreDNS's own order
// (core/dnsserver/zdirectives.go), run coremain. The rest of plugin.cfg (cloud DNS
// providers, etcd, dnstap, ...) would only make the build several times longer.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/autopath"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/debug"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/rewrite"
	_ "github.com/coredns/coredns/plugin/whoami"
)

func init() {
	dnsserver.Directives = []string{
		"reload", "bind", "debug", "ready", "health", "prometheus", "errors", "log", "loadbalance",
		"rewrite", "autopath", "cache", "hosts", "kubernetes", "loop", "forward", "whoami",
	}
}

func main() { coremain.Run() }
