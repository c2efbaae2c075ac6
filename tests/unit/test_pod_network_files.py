"""What the kubelet writes into a pod (resolv.conf, hosts) and the CNI config a node gets."""

from __future__ import annotations

from pathlib import Path

from gpulab.runtime import dnsconfig, images, network


def _pod(**spec):
    return {"metadata": {"name": "trainer-0", "namespace": "team-a", "uid": "u1"}, "spec": spec}


def test_cluster_first_names_cluster_dns_with_the_kubelets_search_path():
    text = dnsconfig.resolv_conf(_pod())
    assert text == ("search team-a.svc.cluster.local svc.cluster.local cluster.local\n"
                    "nameserver 10.96.0.10\noptions ndots:5\n")


def test_dns_config_adds_to_the_policy_and_none_keeps_only_it():
    pod = _pod(dnsConfig={"nameservers": ["1.2.3.4"], "searches": ["corp.example"],
                          "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]})
    text = dnsconfig.resolv_conf(pod)
    assert "nameserver 10.96.0.10\nnameserver 1.2.3.4\n" in text
    assert "cluster.local corp.example\n" in text
    assert text.endswith("options ndots:2 edns0\n")
    only = dnsconfig.resolv_conf(_pod(dnsPolicy="None", dnsConfig={"nameservers": ["1.2.3.4"]}))
    assert only == "nameserver 1.2.3.4\n"


def test_hosts_names_the_pod_by_its_subdomain_fqdn_and_its_aliases():
    pod = _pod(hostname="trainer-0", subdomain="workers", hostAliases=[{"ip": "10.1.2.3", "hostnames": ["db"]}])
    text = dnsconfig.hosts_file(pod, "10.244.1.7")
    assert text.startswith("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n")
    assert "10.244.1.7\ttrainer-0.workers.team-a.svc.cluster.local\ttrainer-0\n" in text
    assert text.endswith("# Entries added by HostAliases.\n10.1.2.3\tdb\n")
    assert "10.244.1.7\ttrainer-0\n" in dnsconfig.hosts_file(_pod(), "10.244.1.7")


def test_write_mounts_the_three_files_at_their_etc_paths(tmp_path: Path):
    mounts = dnsconfig.write(_pod(), "10.244.1.7", tmp_path)
    assert sorted(m.container_path for m in mounts) == ["/etc/hostname", "/etc/hosts", "/etc/resolv.conf"]
    assert (tmp_path / "etc" / "hostname").read_text() == "trainer-0\n"


def test_a_nodes_cni_config_is_a_bridge_on_its_pod_cidr_with_host_local_ipam(tmp_path: Path):
    assert [network.bridge_name(c) for c in ("10.244.0.0/24", "10.244.3.0/24", "10.245.3.0/24", "10.247.255.0/24")] \
        == ["cni0", "cni3", "cni259", "cni1023"]
    conf = network.conflist(tmp_path, "10.244.3.0/24", network.bridge_name("10.244.3.0/24"))
    bridge, portmap = conf["plugins"]
    assert (bridge["type"], bridge["bridge"], bridge["isGateway"]) == ("bridge", "cni3", True)
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.244.3.0/24"}]]
    assert bridge["ipam"]["dataDir"].startswith(str(tmp_path))
    assert portmap["capabilities"] == {"portMappings": True}


def test_a_plugins_config_carries_the_lists_name_version_and_previous_result():
    conf = network.conflist(Path("/x"), "10.244.0.0/24", "cni0")
    prev = {"ips": [{"address": "10.244.0.5/24"}]}
    pod = {"spec": {"containers": [{"ports": [{"containerPort": 80, "hostPort": 8080}]}]}}
    one = network._plugin_conf(conf, conf["plugins"][1], prev, network._runtime_config(pod, conf["plugins"][1]))
    assert (one["name"], one["cniVersion"], one["prevResult"]) == ("gpulab", "1.0.0", prev)
    assert one["runtimeConfig"]["portMappings"][0]["hostPort"] == 8080
    assert "capabilities" not in one
    assert network._first_ip(prev) == "10.244.0.5"


def test_an_image_is_known_by_its_repository_whatever_its_tag_or_digest():
    catalog = images.ImageCatalog([images.Entrypoint("registry.k8s.io/coredns/coredns", ("/coredns",),
                                                     Path("/bin/coredns"))])
    assert catalog.lookup("registry.k8s.io/coredns/coredns:v1.14.7") is not None
    assert catalog.lookup("registry.k8s.io/coredns/coredns@sha256:abc") is not None
    assert catalog.lookup("localhost:5000/coredns") is None
    assert images.image_repository("localhost:5000/x/y:1") == "localhost:5000/x/y"


def test_each_node_has_an_address_of_its_own_on_the_pod_network_and_the_loopback_without_one():
    from gpulab.cluster import nodes
    from gpulab.kube import names, topology

    topo = topology.load(Path(__file__).parents[2] / "manifests" / "topologies" / "default.yaml")
    with_network = [nodes.addresses(spec, i, True) for i, spec in enumerate(topo.nodes)]
    assert [a[0] for a in with_network] == [{"type": "InternalIP", "address": f"10.240.0.{i + 2}"}
                                             for i in range(len(topo.nodes))]
    assert [a[1] for a in with_network] == [{"type": "Hostname", "address": s.name} for s in topo.nodes]
    assert nodes.internal_ips(topo, False) == ("127.0.0.1",)
    assert len(nodes.internal_ips(topo, True)) == len(topo.nodes)
    assert names.node_address(999) == "10.240.3.233"  # a 1000-node fleet fits
    for bad in (-1, 65533):
        try:
            names.node_address(bad)
        except ValueError as e:
            assert str(bad) in str(e) and names.NODE_CIDR in str(e)
        else:
            raise AssertionError(f"node index {bad} was given an address")


def test_a_host_program_reaches_the_nodes_through_the_egress_and_the_apiserver_directly():
    from gpulab.cluster import metricsserver

    assert metricsserver.proxy_env(None) == {}
    env = metricsserver.proxy_env(40123)
    assert env["HTTPS_PROXY"] == env["https_proxy"] == "http://127.0.0.1:40123"
    assert "127.0.0.1" in env["NO_PROXY"].split(",")


def test_a_serving_certificate_is_reissued_when_it_lacks_an_address(tmp_path: Path):
    from cryptography import x509

    from gpulab.kube import pki

    pki.ensure(tmp_path)
    crt, _ = pki.issue_server(tmp_path, "node-agent", "gpulab:node-agent", ())
    first = crt.read_bytes()
    assert pki.issue_server(tmp_path, "node-agent", "gpulab:node-agent", ())[0].read_bytes() == first
    pki.issue_server(tmp_path, "node-agent", "gpulab:node-agent", (), ("10.240.0.2", "10.240.0.3"))
    sans = x509.load_pem_x509_certificate(crt.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "10.240.0.2",
                                                                            "10.240.0.3"}
