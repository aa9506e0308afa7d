//! Builders and validation from YAML fixtures: what the operator creates for a job, without an
//! API server.

// Test helpers panic on purpose: a failed step is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::ResourceExt;
use tandem_api::contract::{self, env};
use tandem_api::names;
use tandem_api::{JobConfig, LaunchEnv, Role, TrainingJob};
use tandem_operator::validate::ValidatedJob;
use tandem_operator::{builder, validate};

fn fixture(name: &str) -> TrainingJob {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `job` validated, as the controller hands it to the builders.
fn valid(job: &TrainingJob) -> ValidatedJob<'_> {
    validate::validate(job).unwrap_or_else(|e| panic!("{e}"))
}

fn main_container(pod: &Pod) -> &Container {
    let spec = pod.spec.as_ref().unwrap();
    spec.containers.iter().find(|c| c.name == names::CONTAINER).expect("a container named tandem")
}

fn env_map(c: &Container) -> BTreeMap<String, String> {
    c.env.iter().flatten().filter_map(|e| Some((e.name.clone(), e.value.clone()?))).collect()
}

#[test]
fn fixtures_pass_validation_except_the_invalid_one() {
    for name in ["hybrid.yaml", "mpi.yaml", "efa-template.yaml", "user-command.yaml"] {
        validate::validate(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let err = validate::validate(&fixture("invalid-name.yaml")).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("-g7-launcher") && text.contains("63"), "{text}");
}

#[test]
fn pods_carry_the_launch_contract_that_the_trainer_reads_back() {
    let job = fixture("hybrid.yaml");
    for (role, attempt) in [(Role::Ps { index: 1 }, 0), (Role::Worker { group: 1, rank: 0 }, 2)] {
        let pod = builder::pod(&valid(&job), role, attempt);
        assert_eq!(pod.name_any(), names::pod("mnist-hybrid", role));
        assert_eq!(pod.namespace().as_deref(), Some("research"));
        let c = main_container(&pod);
        let vars = env_map(c);
        // The trainer side of the contract parses these variables (the pod IP fills TANDEM_BIND).
        let launch = LaunchEnv::from_lookup(|k| {
            if k == env::BIND { Some("10.0.0.7".to_owned()) } else { vars.get(k).cloned() }
        })
        .unwrap();
        assert_eq!(launch.role, role);
        assert_eq!(launch.attempt, attempt);
        assert_eq!(launch.config.to_str(), Some("/etc/tandem/job.json"));
        let bind = c.env.iter().flatten().find(|e| e.name == env::BIND).unwrap();
        let field = bind.value_from.as_ref().unwrap().field_ref.as_ref().unwrap();
        assert_eq!(field.field_path, "status.podIP");
        // The config and token are mounted where the variables point.
        let mounts: Vec<_> = c.volume_mounts.iter().flatten().map(|m| m.mount_path.as_str()).collect();
        assert!(mounts.contains(&"/etc/tandem") && mounts.contains(&"/var/run/tandem"), "{mounts:?}");
        let spec = pod.spec.as_ref().unwrap();
        // A PS restarts in place (its pod, and so its checkpoint folder, stays); workers never.
        let policy = if matches!(role, Role::Ps { .. }) { "OnFailure" } else { "Never" };
        assert_eq!(spec.restart_policy.as_deref(), Some(policy));
        assert_eq!(spec.subdomain.as_deref(), Some("mnist-hybrid"));
        assert_eq!(spec.hostname, pod.metadata.name);
        let owner = &pod.owner_references()[0];
        assert_eq!((owner.kind.as_str(), owner.controller), ("TrainingJob", Some(true)));
        assert_eq!(owner.uid, "7c1a2b3c-0000-4000-8000-000000000001");
        assert_eq!(names::role_of(pod.labels()), Some(role));
        assert_eq!(pod.labels()["app.kubernetes.io/managed-by"], "tandem-operator");
        assert_eq!(c.command.as_deref(), Some(&["tandem".to_owned(), role.name().to_owned()][..]));
    }
}

#[test]
fn a_users_command_runs_in_its_image_with_torchruns_variables_and_the_ps_stays_tandem() {
    let job = fixture("user-command.yaml");
    let pod = builder::pod(&valid(&job), Role::Worker { group: 1, rank: 1 }, 2);
    let c = main_container(&pod);
    assert_eq!(c.image.as_deref(), Some("my-pytorch:1.0"));
    assert_eq!(c.command.as_deref(), Some(&["python3".to_owned(), "train.py".to_owned()][..]));
    assert_eq!(c.args.as_deref(), Some(&["--lr".to_owned(), "0.1".to_owned()][..]));
    // Only rank 0 listens (torch's store): no readiness probe that rank 1 could never pass.
    assert!(c.readiness_probe.is_none());
    let vars = env_map(c);
    let master = names::pod_host("my-ddp", "research", Role::Worker { group: 1, rank: 0 });
    for (name, value) in [
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "1"),
        ("MASTER_ADDR", master.as_str()),
        ("MASTER_PORT", &contract::WORKER_PORT.to_string()),
        ("TORCHELASTIC_RESTART_COUNT", "2"),
        ("TANDEM_GROUP", "1"),
        ("TANDEM_GROUPS", "2"),
        ("TANDEM_CHECKPOINT_DIR", "/var/lib/tandem/checkpoints/group-1"),
        ("TANDEM_PROGRESS_FILE", "/var/lib/tandem/progress/group-1.2.jsonl"),
        ("TANDEM_STEPS", "300"),
        ("PYTHONUNBUFFERED", "1"),
    ] {
        assert_eq!(vars.get(name).map(String::as_str), Some(value), "{name}");
    }
    let ps = names::pod_host("my-ddp", "research", Role::Ps { index: 0 });
    assert_eq!(vars["TANDEM_PS_ENDPOINTS"], format!("{ps}:{}", contract::PS_PORT));
    // The same variables as the local runner's, bar the bind address the kubelet fills in.
    let bind = c.env.iter().flatten().find(|e| e.name == env::BIND).unwrap();
    assert_eq!(bind.value_from.as_ref().unwrap().field_ref.as_ref().unwrap().field_path, "status.podIP");
    // Rank 1 reports nothing, and waits for rank 0 before the user's command starts; rank 0 has
    // the native sidecar that serves its group's progress file.
    let inits = pod.spec.as_ref().unwrap().init_containers.clone().unwrap();
    let [wait] = &inits[..] else { panic!("one init container: {inits:?}") };
    assert_eq!(wait.name, builder::MASTER_WAIT);
    assert_eq!(wait.restart_policy, None);
    assert_eq!(wait.image.as_deref(), Some("tandem-trainer:0.1"));
    assert_eq!(wait.command.as_deref(), Some(&["tandem".to_owned(), "wait-master".to_owned()][..]));
    assert_eq!(env_map(wait)["MASTER_ADDR"], master);
    let rank0 = builder::pod(&valid(&job), Role::Worker { group: 1, rank: 0 }, 2);
    let sidecars = rank0.spec.as_ref().unwrap().init_containers.clone().unwrap();
    let [sidecar] = &sidecars[..] else { panic!("one sidecar: {sidecars:?}") };
    assert_eq!(sidecar.name, builder::PROGRESS_SIDECAR);
    assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
    assert_eq!(sidecar.image.as_deref(), Some("tandem-trainer:0.1"));
    assert_eq!(sidecar.command.as_deref(), Some(&["tandem".to_owned(), "progress".to_owned()][..]));
    // Rank 0 reaches its own store at its pod IP, not through its name.
    let master_addr =
        main_container(&rank0).env.iter().flatten().find(|e| e.name == "MASTER_ADDR").unwrap().clone();
    assert_eq!(master_addr.value_from.unwrap().field_ref.unwrap().field_path, "status.podIP");
    let sidecar_vars = env_map(sidecar);
    assert_eq!(sidecar_vars["TANDEM_PROGRESS_FILE"], env_map(main_container(&rank0))["TANDEM_PROGRESS_FILE"]);
    assert!(!sidecar_vars.contains_key("PYTHONUNBUFFERED"));
    let port = sidecar.ports.as_ref().unwrap()[0].container_port;
    assert_eq!(port, i32::from(contract::STATUS_PORT));
    // Its parameter server still runs `tandem ps` from the job's image, without the user's env.
    let ps_pod = builder::pod(&valid(&job), Role::Ps { index: 0 }, 0);
    let c = main_container(&ps_pod);
    assert_eq!(c.image.as_deref(), Some("tandem-trainer:0.1"));
    assert_eq!(c.command.as_deref(), Some(&["tandem".to_owned(), "ps".to_owned()][..]));
    assert!(!env_map(c).contains_key("PYTHONUNBUFFERED") && !env_map(c).contains_key("RANK"));
}

/// `job` switched to `algorithm: allreduce`: one group of `size` ranks on `backend`, no PS.
fn allreduce(mut job: TrainingJob, backend: &str, size: u32) -> TrainingJob {
    let mut spec = serde_json::to_value(&job.spec).unwrap();
    spec["training"]["algorithm"] = "allreduce".into();
    spec["parameterServers"]["replicas"] = 0.into();
    spec["workers"] = serde_json::json!({"groups": 1, "groupSize": size, "minGroups": 1, "maxGroups": 1, "backend": backend});
    spec["network"] = serde_json::json!({});
    job.spec = serde_json::from_value(spec).unwrap();
    job
}

fn init_containers(pod: &Pod) -> Vec<Container> {
    pod.spec.as_ref().unwrap().init_containers.clone().unwrap_or_default()
}

#[test]
fn a_job_without_parameter_servers_reports_through_the_progress_sidecar_of_its_rank_0() {
    let file = "/var/lib/tandem/progress/group-0.3.jsonl";
    // tcp: rank 0's `tandem worker` appends to the file that its sidecar follows.
    let job = allreduce(fixture("hybrid.yaml"), "tcp", 2);
    let job = valid(&job);
    assert!(job.progress_from_groups());
    let rank0 = builder::pod(&job, Role::Worker { group: 0, rank: 0 }, 3);
    assert_eq!(
        main_container(&rank0).command.as_deref(),
        Some(&["tandem".to_owned(), "worker".to_owned()][..])
    );
    assert_eq!(env_map(main_container(&rank0))["TANDEM_PROGRESS_FILE"], file);
    let [sidecar] = &init_containers(&rank0)[..] else { panic!("one sidecar: {rank0:?}") };
    assert_eq!(sidecar.name, builder::PROGRESS_SIDECAR);
    assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
    assert_eq!(env_map(sidecar)["TANDEM_PROGRESS_FILE"], file);
    // Rank 1 serves nothing and waits for no one (the built-in tcp rendezvous retries).
    let rank1 = builder::pod(&job, Role::Worker { group: 0, rank: 1 }, 3);
    assert!(init_containers(&rank1).is_empty(), "{rank1:?}");
    // mpi: the launcher's mpirun forwards the file to the ranks; rank 0 runs on worker 0's pod
    // (the hostfile's first line), where the sidecar follows it.
    let job = allreduce(fixture("mpi.yaml"), "mpi", 3);
    let job = valid(&job);
    let launcher = builder::pod(&job, Role::Launcher { group: 0 }, 3);
    assert_eq!(env_map(main_container(&launcher))["TANDEM_PROGRESS_FILE"], file);
    assert!(init_containers(&launcher).is_empty());
    let rank0 = builder::pod(&job, Role::Worker { group: 0, rank: 0 }, 3);
    let [sidecar] = &init_containers(&rank0)[..] else { panic!("one sidecar: {rank0:?}") };
    assert_eq!(env_map(sidecar)["TANDEM_PROGRESS_FILE"], file);
    // With parameter servers, PS 0 reports: no sidecar, no file.
    let job = fixture("hybrid.yaml");
    let job = valid(&job);
    assert!(!job.progress_from_groups());
    let rank0 = builder::pod(&job, Role::Worker { group: 0, rank: 0 }, 3);
    assert!(init_containers(&rank0).is_empty());
    assert!(!env_map(main_container(&rank0)).contains_key("TANDEM_PROGRESS_FILE"));
}

/// The container ports named `metrics` in `pod`, by container name.
fn metrics_ports(pod: &Pod) -> Vec<(String, i32)> {
    let spec = pod.spec.as_ref().unwrap();
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| {
            c.ports
                .iter()
                .flatten()
                .filter(|p| p.name.as_deref() == Some(contract::METRICS_PORT_NAME))
                .map(|p| (c.name.clone(), p.container_port))
        })
        .collect()
}

/// Issue 42, item 2: every process that serves metrics gets the contract's metrics port and
/// `TANDEM_METRICS_PORT`, exactly one per pod (a second would clash in the pod's network): the
/// PS and the built-in worker themselves, a launcher's ranks through mpirun (it forwards
/// `TANDEM_*`), and beside a user's command, which serves none, rank 0's progress sidecar.
#[test]
fn each_ps_and_worker_pod_serves_metrics_from_exactly_one_container() {
    let port = i32::from(contract::METRICS_PORT);
    let want = contract::METRICS_PORT.to_string();
    let hybrid = fixture("hybrid.yaml");
    let job = valid(&hybrid);
    for role in
        [Role::Ps { index: 1 }, Role::Worker { group: 0, rank: 0 }, Role::Worker { group: 1, rank: 1 }]
    {
        let pod = builder::pod(&job, role, 0);
        assert_eq!(metrics_ports(&pod), vec![("tandem".to_owned(), port)], "{role}");
        assert_eq!(env_map(main_container(&pod))[env::METRICS_PORT], want, "{role}");
    }
    // Built-in allreduce: rank 0's sidecar serves progress on the status port, the worker metrics.
    let tcp = allreduce(fixture("hybrid.yaml"), "tcp", 2);
    let rank0 = builder::pod(&valid(&tcp), Role::Worker { group: 0, rank: 0 }, 0);
    assert_eq!(metrics_ports(&rank0), vec![("tandem".to_owned(), port)]);
    let [sidecar] = &init_containers(&rank0)[..] else { panic!("one sidecar: {rank0:?}") };
    assert!(!env_map(sidecar).contains_key(env::METRICS_PORT));
    // mpi: the ranks run on the worker pods, started by the launcher's mpirun.
    let mpi = allreduce(fixture("mpi.yaml"), "mpi", 3);
    let launcher = builder::pod(&valid(&mpi), Role::Launcher { group: 0 }, 0);
    assert_eq!(env_map(main_container(&launcher))[env::METRICS_PORT], want);
    assert!(metrics_ports(&launcher).is_empty());
    let worker = builder::pod(&valid(&mpi), Role::Worker { group: 0, rank: 2 }, 0);
    assert_eq!(metrics_ports(&worker), vec![("tandem".to_owned(), port)]);
    // A user's command: its rank 0's sidecar serves the group's metrics; other ranks none.
    let user = fixture("user-command.yaml");
    let user = valid(&user);
    let rank0 = builder::pod(&user, Role::Worker { group: 0, rank: 0 }, 0);
    assert_eq!(metrics_ports(&rank0), vec![(builder::PROGRESS_SIDECAR.to_owned(), port)]);
    assert!(!env_map(main_container(&rank0)).contains_key(env::METRICS_PORT));
    let [sidecar] = &init_containers(&rank0)[..] else { panic!("one sidecar: {rank0:?}") };
    assert_eq!(env_map(sidecar)[env::METRICS_PORT], want);
    let rank1 = builder::pod(&user, Role::Worker { group: 0, rank: 1 }, 0);
    assert!(metrics_ports(&rank1).is_empty());
}

/// Issue 38: a `backend: mpi` group running the user's command: its workers run sshd from the
/// user's image (no metrics port, no master wait), rank 0's pod has the progress sidecar that
/// serves the group's progress and metrics, and the launcher runs `tandem launcher` from the job's
/// image, whose mpirun starts the command with the contract.
#[test]
fn an_mpi_group_of_a_users_command_runs_sshd_in_the_users_image_and_the_launcher_from_the_jobs() {
    let mut job = fixture("user-command.yaml");
    job.spec.workers.backend = tandem_api::Backend::Mpi;
    let job = valid(&job);
    let rank1 = builder::pod(&job, Role::Worker { group: 0, rank: 1 }, 0);
    let c = main_container(&rank1);
    assert_eq!(c.image.as_deref(), Some("my-pytorch:1.0"));
    assert_eq!(c.command.as_ref().unwrap()[0], builder::SSHD_COMMAND);
    assert!(init_containers(&rank1).is_empty(), "no master wait: mpirun starts the ranks");
    assert!(metrics_ports(&rank1).is_empty());
    let rank0 = builder::pod(&job, Role::Worker { group: 0, rank: 0 }, 0);
    assert_eq!(main_container(&rank0).command.as_ref().unwrap()[0], builder::SSHD_COMMAND);
    let [sidecar] = &init_containers(&rank0)[..] else { panic!("one sidecar: {rank0:?}") };
    assert_eq!(sidecar.name, builder::PROGRESS_SIDECAR);
    assert_eq!(
        metrics_ports(&rank0),
        vec![(builder::PROGRESS_SIDECAR.to_owned(), i32::from(contract::METRICS_PORT))]
    );
    let launcher = builder::pod(&job, Role::Launcher { group: 0 }, 2);
    let c = main_container(&launcher);
    assert_eq!(c.image.as_deref(), Some("tandem-trainer:0.1"));
    assert_eq!(c.command.as_deref(), Some(&["tandem".to_owned(), "launcher".to_owned()][..]));
    // The launcher's progress file is the one the sidecar on rank 0's pod follows.
    let file = "/var/lib/tandem/progress/group-0.2.jsonl";
    assert_eq!(env_map(c)["TANDEM_PROGRESS_FILE"], file);
    let rank0_attempt2 = builder::pod(&job, Role::Worker { group: 0, rank: 0 }, 2);
    let [sidecar] = &init_containers(&rank0_attempt2)[..] else { panic!("one sidecar") };
    assert_eq!(env_map(sidecar)["TANDEM_PROGRESS_FILE"], file);
}

#[test]
fn job_config_lists_every_ps_and_group_by_dns_name() {
    let job = fixture("hybrid.yaml");
    let cm = builder::config_map(&valid(&job));
    assert_eq!(cm.name_any(), "mnist-hybrid-config");
    let config = JobConfig::from_json(&cm.data.unwrap()[contract::CONFIG_FILE]).unwrap();
    assert_eq!(config.job_name, "mnist-hybrid");
    assert_eq!(config.parameter_servers.len(), 2);
    assert_eq!(config.parameter_servers[1].to_string(), "mnist-hybrid-ps-1.mnist-hybrid.research.svc:7070");
    assert_eq!(config.groups.len(), 2);
    assert_eq!(
        config.group(1).unwrap().peers[1].to_string(),
        "mnist-hybrid-g1-1.mnist-hybrid.research.svc:7071"
    );
    assert_eq!(config.spec, job.spec);
}

#[test]
fn service_is_headless_and_publishes_unready_pods() {
    let svc = builder::service(&valid(&fixture("mpi.yaml")));
    let spec = svc.spec.unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
    assert_eq!(spec.publish_not_ready_addresses, Some(true));
    let ports: Vec<i32> = spec.ports.unwrap().iter().map(|p| p.port).collect();
    assert_eq!(ports, vec![7070, 7071, 2222]);
    assert_eq!(spec.selector.unwrap()[names::LABEL_JOB], "bert");
}

#[test]
fn mpi_groups_get_sshd_workers_a_hostfile_and_a_launcher_with_the_key() {
    let job = fixture("mpi.yaml");
    let hostfile = builder::hostfile(&valid(&job), 1);
    assert_eq!(hostfile.name_any(), "bert-g1-hostfile");
    assert_eq!(
        hostfile.data.unwrap()["hostfile"],
        "bert-g1-0.bert.nlp.svc slots=1\nbert-g1-1.bert.nlp.svc slots=1\nbert-g1-2.bert.nlp.svc slots=1\n"
    );
    let worker = builder::pod(&valid(&job), Role::Worker { group: 1, rank: 2 }, 0);
    let c = main_container(&worker);
    assert_eq!(c.command.as_deref().unwrap(), ["tandem-sshd", "-p", "2222"]);
    let worker_ssh = worker.spec.as_ref().unwrap().volumes.as_ref().unwrap();
    let worker_items: Vec<String> = worker_ssh
        .iter()
        .find(|v| v.name == "tandem-ssh")
        .unwrap()
        .secret
        .as_ref()
        .unwrap()
        .items
        .as_ref()
        .unwrap()
        .iter()
        .map(|i| i.path.clone())
        .collect();
    assert!(
        worker_items.contains(&"host-ca-key".to_owned()),
        "workers certify their host key: {worker_items:?}"
    );
    let probe = c.readiness_probe.as_ref().unwrap().tcp_socket.as_ref().unwrap();
    assert_eq!(probe.port, k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(2222));
    let launcher = builder::pod(&valid(&job), Role::Launcher { group: 1 }, 0);
    let lc = main_container(&launcher);
    assert_eq!(lc.command.as_deref(), Some(&["tandem".to_owned(), "launcher".to_owned()][..]));
    let vars = env_map(lc);
    assert_eq!(vars["OMPI_MCA_orte_default_hostfile"], "/etc/tandem/mpi/hostfile");
    let rsh = &vars["OMPI_MCA_plm_rsh_args"];
    assert!(rsh.contains("-p 2222"), "{rsh}");
    // Host keys are checked against the job's CA, never accepted blindly.
    assert!(rsh.contains("StrictHostKeyChecking=yes"), "{rsh}");
    assert!(rsh.contains("UserKnownHostsFile=/etc/tandem/ssh/known_hosts"), "{rsh}");
    let volumes = launcher.spec.as_ref().unwrap().volumes.as_ref().unwrap();
    let hostfile_volume = volumes.iter().find(|v| v.name == "tandem-hostfile").unwrap();
    assert_eq!(hostfile_volume.config_map.as_ref().unwrap().name, "bert-g1-hostfile");
    let ssh = volumes.iter().find(|v| v.name == "tandem-ssh").unwrap().secret.as_ref().unwrap();
    assert_eq!(ssh.secret_name.as_deref(), Some("bert-ssh"));
    let items: Vec<&str> = ssh.items.as_ref().unwrap().iter().map(|i| i.path.as_str()).collect();
    assert!(items.contains(&"known_hosts"), "{items:?}");
    assert!(!items.contains(&"host-ca-key"), "the launcher does not get the host CA key: {items:?}");
    // The launcher needs no RDMA device and does not carry the workers' resources.
    assert!(lc.resources.is_none());
    // `tandem launcher` adds --allow-run-as-root itself, only when it runs as root.
    assert!(!vars.contains_key("OMPI_ALLOW_RUN_AS_ROOT"), "{vars:?}");
    // The image's tandem user (uid 1000) reads the root-owned SSH key through its group.
    for pod in [&worker, &launcher] {
        let security = pod.spec.as_ref().unwrap().security_context.as_ref().unwrap();
        assert_eq!(security.fs_group, Some(builder::TRAINER_FS_GROUP));
    }
    // So does every other pod, for the root-owned 0400 token (a real kubelet showed a PS as uid 1000
    // failing to read it without an fsGroup).
    let ps = builder::pod(&valid(&job), Role::Ps { index: 0 }, 0);
    assert_eq!(
        ps.spec.as_ref().unwrap().security_context.as_ref().unwrap().fs_group,
        Some(builder::TRAINER_FS_GROUP)
    );
    let mut custom = job.clone();
    custom.spec.workers.template = Some(
        serde_json::from_value(serde_json::json!({"spec": {"securityContext": {"fsGroup": 2000}}})).unwrap(),
    );
    let pod = builder::pod(&valid(&custom), Role::Launcher { group: 1 }, 0);
    assert_eq!(
        pod.spec.unwrap().security_context.unwrap().fs_group,
        Some(2000),
        "the template's fsGroup wins"
    );
}

#[test]
fn pods_get_a_grace_period_for_the_preemption_checkpoint_unless_the_template_sets_one() {
    let job = fixture("hybrid.yaml");
    let roles = [Role::Ps { index: 0 }, Role::Worker { group: 0, rank: 1 }, Role::Launcher { group: 1 }];
    for role in roles {
        let pod = builder::pod(&valid(&job), role, 0);
        assert_eq!(
            pod.spec.unwrap().termination_grace_period_seconds,
            Some(contract::TERMINATION_GRACE_SECONDS),
            "{role}"
        );
    }
    let mut custom = job.clone();
    custom.spec.workers.template = Some(
        serde_json::from_value(serde_json::json!({"spec": {"terminationGracePeriodSeconds": 600}})).unwrap(),
    );
    let pod = builder::pod(&valid(&custom), Role::Worker { group: 0, rank: 0 }, 0);
    assert_eq!(pod.spec.unwrap().termination_grace_period_seconds, Some(600), "the template's wins");
}

#[test]
fn infiniband_preset_requests_the_configured_device_and_pins_memory() {
    let job = fixture("mpi.yaml");
    let worker = builder::pod(&valid(&job), Role::Worker { group: 0, rank: 0 }, 0);
    let c = main_container(&worker);
    let resources = c.resources.as_ref().unwrap();
    assert_eq!(resources.limits.as_ref().unwrap()["rdma/ib"].0, "2");
    assert_eq!(resources.requests.as_ref().unwrap()["rdma/ib"].0, "2");
    assert_eq!(resources.limits.as_ref().unwrap()["cpu"].0, "8", "user resources kept");
    let caps = c.security_context.as_ref().unwrap().capabilities.as_ref().unwrap();
    assert_eq!(caps.add.as_deref(), Some(&["IPC_LOCK".to_owned()][..]));
    assert_eq!(env_map(c)["OMPI_MCA_pml"], "ucx");
    assert!(c.volume_mounts.iter().flatten().any(|m| m.mount_path == "/dev/shm"));
    // PS pods are plain TCP.
    let ps = builder::pod(&valid(&job), Role::Ps { index: 0 }, 0);
    assert!(main_container(&ps).security_context.is_none());
}

#[test]
fn gang_scheduling_builds_a_volcano_pod_group_without_launchers() {
    let job = fixture("mpi.yaml");
    let pg = builder::pod_group(&valid(&job));
    assert_eq!(pg.types.as_ref().unwrap().api_version, "scheduling.volcano.sh/v1beta1");
    assert_eq!(pg.data["spec"]["minMember"], 4, "1 PS + minGroups 1 x 3 ranks, launchers excluded");
    assert_eq!(pg.data["spec"]["queue"], "research");
    assert_eq!(pg.data["spec"]["priorityClassName"], "high");
    let worker = builder::pod(&valid(&job), Role::Worker { group: 0, rank: 0 }, 0);
    assert_eq!(worker.annotations()[builder::VOLCANO_GROUP_ANNOTATION], "bert");
    let spec = worker.spec.unwrap();
    assert_eq!(spec.scheduler_name.as_deref(), Some("volcano"));
    assert_eq!(spec.priority_class_name.as_deref(), Some("high"));
}

#[test]
fn user_template_is_kept_under_the_operator_settings() {
    let job = fixture("efa-template.yaml");
    let pod = builder::pod(&valid(&job), Role::Worker { group: 0, rank: 1 }, 0);
    assert_eq!(pod.labels()["team"], "vision");
    assert_eq!(pod.annotations()["sidecar.istio.io/inject"], "false");
    assert_eq!(pod.labels()[builder::SCHEDULER_PLUGINS_GROUP_LABEL], "resnet");
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.scheduler_name.as_deref(), Some(builder::SCHEDULER_PLUGINS_SCHEDULER));
    assert_eq!(spec.node_selector.as_ref().unwrap()["node.kubernetes.io/instance-type"], "p5.48xlarge");
    assert_eq!(spec.tolerations.as_ref().unwrap().len(), 1);
    assert_eq!(spec.containers.len(), 1);
    let c = main_container(&pod);
    assert_eq!(c.image.as_deref(), Some("registry.example/resnet:2"), "the template's image wins");
    let vars = env_map(c);
    assert_eq!(vars["NCCL_DEBUG"], "INFO");
    assert_eq!(vars["FI_PROVIDER"], "user-choice", "a user's variable is not overridden by the preset");
    assert_eq!(vars["FI_EFA_USE_DEVICE_RDMA"], "1");
    assert_eq!(vars["OMPI_MCA_btl"], "tcp,self,vader", "shared memory between ranks on one node");
    let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert_eq!(limits[builder::EFA_RESOURCE].0, "32");
    assert_eq!(limits["hugepages-2Mi"].0, "5120Mi");
    let volumes = spec.volumes.as_ref().unwrap();
    assert!(volumes.iter().any(|v| v.name == "data"), "user volume kept");
    let output = volumes.iter().find(|v| v.name == "tandem-output").unwrap();
    assert_eq!(output.persistent_volume_claim.as_ref().unwrap().claim_name, "ckpt");
    assert!(c.volume_mounts.iter().flatten().any(|m| m.mount_path == "/data"));
    let pg = builder::pod_group(&valid(&job));
    assert_eq!(pg.types.as_ref().unwrap().api_version, "scheduling.x-k8s.io/v1alpha1");
    assert_eq!(pg.data["spec"]["minMember"], 2);
    // scheduler-plugins' PodGroup has no queue or priority class (its CRD would refuse them).
    let mut queued = job.clone();
    queued.spec.run_policy.scheduling.priority_class_name = Some("high".to_owned());
    let pg = builder::pod_group(&valid(&queued));
    assert_eq!(pg.data["spec"].as_object().unwrap().keys().collect::<Vec<_>>(), ["minMember"]);
}

#[test]
fn the_same_job_always_builds_the_same_objects() {
    let job = fixture("mpi.yaml");
    let a = serde_json::to_string(&builder::pod(&valid(&job), Role::Launcher { group: 0 }, 1)).unwrap();
    let b = serde_json::to_string(&builder::pod(&valid(&job), Role::Launcher { group: 0 }, 1)).unwrap();
    assert_eq!(a, b);
    assert_eq!(builder::config_map(&valid(&job)), builder::config_map(&valid(&job)));
}
