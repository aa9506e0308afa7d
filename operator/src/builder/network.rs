//! Interconnect presets of worker pods (`network.transport`): the RDMA device, IPC_LOCK to pin
//! memory, a large /dev/shm and the UCX/NCCL or libfabric environment. Ethernet adds nothing.
//! A preset never overrides what the user's template set.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, EmptyDirVolumeSource, PodSpec, ResourceRequirements, SecurityContext, Volume,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tandem_api::{NetworkSpec, Transport};

use super::pod::{mount, plain_env};

/// Default RDMA resource of `transport: infiniband` (the Mellanox shared device plugin's example).
pub const DEFAULT_RDMA_RESOURCE: &str = "rdma/hca_shared_devices_a";
/// Extended resource of AWS EFA.
pub const EFA_RESOURCE: &str = "vpc.amazonaws.com/efa";
/// Huge pages an EFA worker gets (libfabric registers its buffers there).
pub const EFA_HUGEPAGES: &str = "5120Mi";

/// Extended resources (name, quantity) and environment of a network preset.
type Preset = (Vec<(String, String)>, Vec<(&'static str, &'static str)>);

/// Applies the preset of `network` to a worker pod whose `tandem` container is number `container`.
pub(super) fn apply(pod_spec: &mut PodSpec, container: usize, network: &NetworkSpec) {
    let devices = network.devices_per_worker.unwrap_or(1).to_string();
    let (extra_limits, extra_env): Preset = match network.transport {
        Transport::Ethernet => return,
        Transport::Infiniband => (
            vec![(
                network.rdma_resource.clone().unwrap_or_else(|| DEFAULT_RDMA_RESOURCE.to_owned()),
                devices,
            )],
            vec![
                ("OMPI_MCA_pml", "ucx"),
                ("OMPI_MCA_btl", "^openib,tcp"),
                ("UCX_TLS", "rc,sm,self"),
                ("NCCL_IB_DISABLE", "0"),
                ("NCCL_SOCKET_IFNAME", "eth0"),
            ],
        ),
        Transport::Efa => (
            vec![(EFA_RESOURCE.to_owned(), devices), ("hugepages-2Mi".to_owned(), EFA_HUGEPAGES.to_owned())],
            vec![
                ("FI_PROVIDER", "efa"),
                ("FI_EFA_USE_DEVICE_RDMA", "1"),
                ("FI_EFA_FORK_SAFE", "1"),
                ("OMPI_MCA_pml", "^ucx"),
                ("OMPI_MCA_btl", "tcp,self,vader"),
                ("NCCL_SOCKET_IFNAME", "eth0"),
            ],
        ),
    };
    let Some(container) = pod_spec.containers.get_mut(container) else { return };
    let resources = container.resources.get_or_insert_with(ResourceRequirements::default);
    for (key, value) in extra_limits {
        // Extended resources and huge pages must be requested and limited alike.
        resources
            .limits
            .get_or_insert_with(BTreeMap::new)
            .entry(key.clone())
            .or_insert(Quantity(value.clone()));
        resources.requests.get_or_insert_with(BTreeMap::new).entry(key).or_insert(Quantity(value));
    }
    let security = container.security_context.get_or_insert_with(SecurityContext::default);
    let capabilities = security.capabilities.get_or_insert_with(Capabilities::default);
    let add = capabilities.add.get_or_insert_with(Vec::new);
    if !add.iter().any(|c| c == "IPC_LOCK") {
        add.push("IPC_LOCK".to_owned());
    }
    let env = container.env.get_or_insert_with(Vec::new);
    for (key, value) in extra_env {
        if !env.iter().any(|e| e.name == key) {
            env.push(plain_env(key, value));
        }
    }
    container.volume_mounts.get_or_insert_with(Vec::new).push(mount("tandem-shm", "/dev/shm", false));
    // RDMA stacks keep large shared-memory segments; the default 64 MiB /dev/shm is too small.
    pod_spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: "tandem-shm".to_owned(),
        empty_dir: Some(EmptyDirVolumeSource { medium: Some("Memory".to_owned()), size_limit: None }),
        ..Volume::default()
    });
}
