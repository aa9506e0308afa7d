# Run as deployed (issue 14): the images built here from docker/ (no Docker daemon, no registry), a real
# node (containerd, runc, CNI bridge, kubelet, kube-scheduler, kube-proxy, CoreDNS, local-path storage)
# beside the test control plane, and the end-to-end tests in real containers. Scripts: scripts/node/.

.PHONY: images image-bases node-deps node-bins node-up node-down e2e-node

TEST_TARGETS += e2e-node

# Under `make test` the images take the dev-profile binaries the tests already built (same code,
# dependencies optimised; a second, release compile of every crate would cost CI minutes); `make images`
# alone builds release binaries. Set TANDEM_IMAGE_PROFILE to choose.
test: export TANDEM_IMAGE_PROFILE ?= dev

## images: build tandem-trainer:0.1 and tandem-operator:<appVersion> from docker/ with buildah, on bases made by mmdebstrap.
images: deps data
	@CARGO="$(CARGO)" scripts/node/images.sh

## image-bases: the base images of `make images` (mmdebstrap, cached under ~/.cache/tandem/images).
image-bases: node-deps
	@scripts/node/base.sh

# The node's Debian packages, once per make (node-bins and image-bases both need them; two apt-get
# runs at once would fight over dpkg's lock).
node-deps:
	@scripts/node/deps.sh

## node-bins: the node's packages (containerd, runc, CNI plugins, podman, buildah) and Go binaries (kubelet, kube-scheduler, kube-proxy, CoreDNS, local-path-provisioner).
node-bins: cluster-bins node-deps
	@scripts/controlplane/build.sh node

## node-up: the control plane plus a real node on a bridge inside this machine; its last line is `export KUBECONFIG=<path>` (needs `make images`).
node-up: node-bins
	@scripts/node/node-up.sh

## node-down: stop the node and the control plane, and restore the host (sysctls, iptables, mounts, cgroups, netns, bridge).
node-down:
	@scripts/node/node-down.sh

## e2e-node: helm install the chart with the built operator image on a real node, then train and break jobs in real containers.
e2e-node: images node-bins prometheus-bin
	@CARGO="$(CARGO)" TANDEM_PROMETHEUS="$$(scripts/prometheus/bin-path.sh)" e2e/node.sh

## prometheus-bin: build the pinned Prometheus of the node's metrics test if missing (scripts/prometheus/).
.PHONY: prometheus-bin
prometheus-bin:
	@scripts/prometheus/build.sh >/dev/null
prepare: prometheus-bin
