//! The launch contract round-trips through JSON and environment variables, and refuses bad input
//! with errors that name the variable.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests fail loudly by design

use std::collections::HashMap;

use tandem_api::contract::{ContractError, env};
use tandem_api::{Endpoint, GroupTopology, JobConfig, LaunchEnv, Role, TrainingJob};

fn hybrid_config() -> JobConfig {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/mnist-hybrid.yaml"))
        .expect("example exists");
    let job: TrainingJob = serde_yaml::from_str(&text).expect("example parses");
    JobConfig {
        job_name: "mnist-hybrid".into(),
        namespace: "team-a".into(),
        spec: job.spec,
        parameter_servers: vec![
            Endpoint::new("mnist-hybrid-ps-0.mnist-hybrid", 7070),
            Endpoint::new("10.0.0.9", 7070),
        ],
        groups: (0..2)
            .map(|g| GroupTopology {
                index: g,
                peers: (0..2)
                    .map(|r| Endpoint::new(format!("mnist-hybrid-g{g}-{r}.mnist-hybrid"), 7071))
                    .collect(),
            })
            .collect(),
    }
}

#[test]
fn job_config_round_trips_through_json() {
    let config = hybrid_config();
    let back = JobConfig::from_json(&config.to_json()).expect("own JSON parses");
    assert_eq!(back, config);
    assert_eq!(
        back.group(1).map(|g| g.peers[0].to_string()).as_deref(),
        Some("mnist-hybrid-g1-0.mnist-hybrid:7071")
    );
    assert!(back.group(7).is_none());
}

#[test]
fn job_config_json_is_camel_case() {
    let json: serde_json::Value = serde_json::from_str(&hybrid_config().to_json()).expect("valid JSON");
    assert!(json.get("parameterServers").is_some());
    assert!(json["spec"]["workers"].get("groupSize").is_some());
}

#[test]
fn malformed_job_config_is_an_error() {
    let err = JobConfig::from_json("{\"jobName\": 3}").expect_err("wrong type");
    assert!(matches!(err, ContractError::Config(_)));
    assert!(err.to_string().starts_with("job config is not valid"), "{err}");
}

fn round_trip(role: Role) {
    let launch = LaunchEnv {
        role,
        config: "/etc/tandem/job.json".into(),
        token_file: "/etc/tandem/token/token".into(),
        bind: "10.1.2.3".into(),
        output: "/var/lib/tandem".into(),
        attempt: 3,
    };
    let vars: HashMap<&str, String> = launch.to_vars().into_iter().collect();
    let back = LaunchEnv::from_lookup(|k| vars.get(k).cloned()).expect("own variables parse");
    assert_eq!(back, launch);
}

#[test]
fn every_role_round_trips_through_the_environment() {
    round_trip(Role::Ps { index: 1 });
    round_trip(Role::Worker { group: 2, rank: 3 });
    round_trip(Role::Launcher { group: 0 });
}

#[test]
fn missing_and_malformed_variables_are_named() {
    let mut vars: HashMap<&str, String> = HashMap::from([
        (env::ROLE, "worker".to_owned()),
        (env::GROUP, "1".to_owned()),
        (env::CONFIG, "/c".to_owned()),
        (env::TOKEN_FILE, "/t".to_owned()),
    ]);
    let err = LaunchEnv::from_lookup(|k| vars.get(k).cloned()).expect_err("rank missing");
    assert_eq!(err, ContractError::Missing(env::RANK));
    assert!(err.to_string().contains("TANDEM_RANK"));

    vars.insert(env::RANK, "two".to_owned());
    let err = LaunchEnv::from_lookup(|k| vars.get(k).cloned()).expect_err("rank malformed");
    assert!(err.to_string().contains("TANDEM_RANK=\"two\""), "{err}");

    vars.insert(env::RANK, "2".to_owned());
    vars.insert(env::ROLE, "chief".to_owned());
    let err = LaunchEnv::from_lookup(|k| vars.get(k).cloned()).expect_err("unknown role");
    assert!(err.to_string().contains("one of ps, worker, launcher"), "{err}");
}

#[test]
fn defaults_apply_when_optional_variables_are_unset() {
    let vars: HashMap<&str, String> = HashMap::from([
        (env::ROLE, "ps".to_owned()),
        (env::PS_INDEX, "0".to_owned()),
        (env::CONFIG, "/c".to_owned()),
        (env::TOKEN_FILE, "/t".to_owned()),
    ]);
    let launch = LaunchEnv::from_lookup(|k| vars.get(k).cloned()).expect("minimal contract");
    assert_eq!(launch.role, Role::Ps { index: 0 });
    assert_eq!(launch.attempt, 0);
    assert_eq!(launch.bind, "0.0.0.0");
}

/// `job.json` is a ConfigMap that anyone who may read ConfigMaps in the namespace reads: the pod
/// templates (whose env may carry values a user meant for the pods only) stay out of it.
#[test]
fn job_config_leaves_the_pod_templates_out() {
    let text = "apiVersion: tandem.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: env}\nspec:
  training: {steps: 10}
  parameterServers:
    replicas: 1
    template: {spec: {containers: [{name: tandem, env: [{name: DB_PASSWORD, value: ps-hunter2}]}]}}
  workers:
    template:
      spec:
        containers:
        - name: tandem
          env:
          - {name: DB_PASSWORD, value: worker-hunter2}
          - name: FROM_SECRET
            valueFrom: {secretKeyRef: {name: creds, key: k}}
";
    let job: TrainingJob = serde_yaml::from_str(text).expect("job parses");
    let config = JobConfig::of_spec("env", "team-a", &job.spec, |_| Endpoint::new("h", 1));
    let json = config.to_json();
    for leaked in ["hunter2", "DB_PASSWORD", "creds"] {
        assert!(!json.contains(leaked), "job.json carries {leaked:?}: {json}");
    }
    assert!(config.spec.workers.template.is_none() && config.spec.parameter_servers.template.is_none());
    // Everything the trainer reads is still there.
    assert_eq!(config.spec.training.steps, Some(10));
    assert_eq!(config.parameter_servers.len(), 1);
}
