//! What restarts together (units), their keys in `status.attempts`, which roles and units a spec
//! has, and the job config's endpoints of every role.

use tandem_api::policy::Unit;
use tandem_api::{Backend, Endpoint, JobConfig, RestartPolicy, Role};

use super::hybrid;

#[test]
fn units_group_the_roles_and_read_back_from_their_keys() {
    assert_eq!(Unit::of(Role::Ps { index: 3 }), Unit::Ps(3));
    assert_eq!(Unit::of(Role::Worker { group: 2, rank: 1 }), Unit::Group(2));
    assert_eq!(Unit::of(Role::Launcher { group: 2 }), Unit::Group(2));
    for unit in [Unit::Ps(0), Unit::Ps(17), Unit::Group(0), Unit::Group(9)] {
        assert_eq!(Unit::from_key(&unit.key()), Some(unit));
    }
    assert_eq!(Unit::Group(4).key(), "group-4");
    assert_eq!(Unit::Ps(1).key(), "ps-1");
    for junk in ["", "group-", "ps-x", "worker-1", "group-1-0", "ps--1"] {
        assert_eq!(Unit::from_key(junk), None, "{junk}");
    }
    assert_eq!(Unit::Group(1).to_string(), "group 1");
    assert_eq!(Unit::Ps(0).to_string(), "parameter server 0");
}

#[test]
fn roles_and_units_are_in_the_spec_within_its_replicas_groups_and_size() {
    let mut spec = hybrid(RestartPolicy::OnFailure, 5, &[]);
    for (role, inside) in [
        (Role::Ps { index: 1 }, true),
        (Role::Ps { index: 2 }, false),
        (Role::Worker { group: 1, rank: 1 }, true),
        (Role::Worker { group: 2, rank: 0 }, false),
        (Role::Worker { group: 0, rank: 2 }, false),
        (Role::Launcher { group: 0 }, false),
    ] {
        assert_eq!(role.in_spec(&spec), inside, "{role}");
    }
    assert!(Unit::Group(1).in_spec(&spec) && Unit::Ps(1).in_spec(&spec));
    spec.workers.groups = 1;
    assert!(!Unit::Group(1).in_spec(&spec), "a scaled-down group");
    assert!(!Unit::Ps(2).in_spec(&spec));
    spec.workers.backend = Backend::Mpi;
    assert!(Role::Launcher { group: 0 }.in_spec(&spec), "an mpi group has a launcher");
    assert!(!Role::Launcher { group: 1 }.in_spec(&spec));
}

#[test]
fn the_job_config_lists_every_ps_and_rank_at_its_endpoint() {
    let spec = hybrid(RestartPolicy::OnFailure, 5, &[]);
    let config = JobConfig::of_spec("j", "ns", &spec, |role| Endpoint::new(role.to_string(), 7));
    assert_eq!((config.job_name.as_str(), config.namespace.as_str()), ("j", "ns"));
    assert_eq!(config.spec, spec);
    let hosts = |endpoints: &[Endpoint]| endpoints.iter().map(|e| e.host.clone()).collect::<Vec<_>>();
    assert_eq!(hosts(&config.parameter_servers), ["ps 0", "ps 1"]);
    assert_eq!(config.groups.iter().map(|g| g.index).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(hosts(&config.groups[1].peers), ["worker 1/0", "worker 1/1"]);
}
