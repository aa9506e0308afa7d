# Names and addresses of the test node (sourced by node-up.sh, node-down.sh and the e2e scripts).
D="${TANDEM_NODE_DIR:-/tmp/tandem-node}"
NODE_NAME="${TANDEM_NODE_NAME:-tandem-node}"
BRIDGE=tandem0
NODE_IP=10.89.0.1
POD_SUBNET=10.89.0.0/24
# The cluster's Service range is cluster-up.sh's 10.0.0.0/24: 10.0.0.1 is `kubernetes`, 10.0.0.10 DNS.
DNS_IP=10.0.0.10
CONTAINERD_SOCK="$D/containerd/containerd.sock"
# The node's own images, built by node-images.sh (nothing is pulled).
PAUSE_IMAGE=localhost/tandem-pause:1.0
COREDNS_IMAGE="localhost/tandem-coredns:$COREDNS_VERSION"
LOCAL_PATH_IMAGE="localhost/tandem-local-path:$LOCAL_PATH_VERSION"
# The local-path helper pods (mkdir/rm of volume folders) run the minbase image.
HELPER_IMAGE=localhost/tandem-base:bookworm
# Host settings kubelet, kube-proxy and node-up change; node-down puts them back.
SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys
  kernel.keys.root_maxbytes net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables
  net.ipv4.conf.all.route_localnet net.netfilter.nf_conntrack_max
  net.netfilter.nf_conntrack_tcp_timeout_established net.netfilter.nf_conntrack_tcp_timeout_close_wait)
