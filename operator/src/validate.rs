//! Validation: the checks a TrainingJob must pass before the operator builds anything for it, and
//! the [`ValidatedJob`] that the rest of a reconcile reads instead of the raw object.
//!
//! Guarantees: validation never touches the API server and never panics; every rejection says
//! which field is wrong and what to change. It repeats the CRD's CEL rules (so an API server
//! without them, or an old CRD, cannot slip a bad spec through) and adds what CEL cannot see:
//! the lengths of the names derived from the job's name, and the server-set metadata (namespace,
//! uid) that owner references need.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;
use tandem_api::{Role, TrainingJob, TrainingJobSpec};

use tandem_api::names;

/// Longest DNS label: pod host names and Service names must fit.
const MAX_LABEL: usize = 63;

/// Why a job cannot be reconciled.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ValidationError {
    /// The spec breaks a cross-field rule.
    #[error("{0}")]
    Spec(String),
    /// The job's name is not usable for the Service or pods.
    #[error(
        "TrainingJob name {name:?} is not usable: {why}; recreate the job under a shorter name of lower-case letters, digits and '-', starting with a letter"
    )]
    Name {
        /// The job's name.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// The object lacks server-set metadata (name, namespace, uid) that owner references need.
    #[error("TrainingJob {0} has no {1}: it must come from the API server")]
    Metadata(String, &'static str),
}

/// A job that passed [`validate`]: the single input of the builders, the plan and the controller's
/// writes, which need not reach into the raw object's optional metadata again.
#[derive(Clone, Copy, Debug)]
pub struct ValidatedJob<'a> {
    /// `metadata.name`: a DNS-1035 label short enough for every derived name.
    pub name: &'a str,
    /// `metadata.namespace`.
    pub namespace: &'a str,
    /// `metadata.uid`.
    pub uid: &'a str,
    /// The spec, defaults applied, its cross-field rules checked.
    pub spec: &'a TrainingJobSpec,
    /// The object as read: its status, generation and creation time, and the reference Events name.
    pub job: &'a TrainingJob,
}

impl ValidatedJob<'_> {
    /// `metadata.generation`.
    pub fn generation(&self) -> Option<i64> {
        self.job.metadata.generation
    }

    /// Whether the job's progress comes from its groups rather than from PS replica 0: each
    /// group's rank 0 appends progress lines to the group's progress file, and a `tandem progress`
    /// sidecar beside it serves them on the status port. True for a job that runs the user's
    /// command, and for a built-in job without parameter servers (`algorithm: allreduce`); a
    /// built-in job with parameter servers is reported by PS replica 0, which hears every group.
    pub fn progress_from_groups(&self) -> bool {
        self.spec.workers.command.is_some() || self.spec.parameter_servers.replicas == 0
    }

    /// The controller owner reference every child carries, so that deleting the job deletes it.
    pub fn owner_reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: TrainingJob::api_version(&()).into_owned(),
            kind: TrainingJob::kind(&()).into_owned(),
            name: self.name.to_owned(),
            uid: self.uid.to_owned(),
            controller: Some(true),
            block_owner_deletion: None,
        }
    }
}

/// Checks `job`; the [`ValidatedJob`] it returns can build every child.
pub fn validate(job: &TrainingJob) -> Result<ValidatedJob<'_>, ValidationError> {
    let meta = &job.metadata;
    let missing = |what| ValidationError::Metadata(meta.name.clone().unwrap_or_default(), what);
    let name = meta.name.as_deref().ok_or_else(|| missing("name"))?;
    let namespace = meta.namespace.as_deref().ok_or_else(|| missing("namespace"))?;
    let uid = meta.uid.as_deref().ok_or_else(|| missing("uid"))?;
    job.spec.validate().map_err(|e| ValidationError::Spec(e.0))?;
    validate_name(name, job.spec.workers.max_groups, job.spec.workers.group_size)?;
    Ok(ValidatedJob { name, namespace, uid, spec: &job.spec, job })
}

/// The job name is the headless Service's name (a DNS-1035 label) and prefixes every pod's
/// host name (a DNS-1123 label), so the longest pod name must stay within 63 characters.
fn validate_name(name: &str, max_groups: u32, group_size: u32) -> Result<(), ValidationError> {
    let bad = |why: String| Err(ValidationError::Name { name: name.to_owned(), why });
    let first_is_letter = name.chars().next().is_some_and(|c| c.is_ascii_lowercase());
    let charset = name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !first_is_letter || !charset || name.ends_with('-') {
        return bad("it must be a DNS-1035 label (it names the job's headless Service)".to_owned());
    }
    let last_group = max_groups.saturating_sub(1);
    // On a tie the last wins: the launcher, the name users recognise.
    let longest = [
        names::hostfile(name, last_group),
        names::pod(name, Role::Worker { group: last_group, rank: group_size.saturating_sub(1) }),
        names::pod(name, Role::Launcher { group: last_group }),
    ]
    .into_iter()
    .max_by_key(String::len)
    .unwrap_or_default();
    if longest.len() > MAX_LABEL {
        return bad(format!(
            "the derived name {longest:?} has {} characters, more than the {MAX_LABEL} a DNS label allows",
            longest.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_are_rejected_with_the_derived_name() {
        let name = "a".repeat(52);
        let err = validate_name(&name, 8, 4).unwrap_err();
        assert!(err.to_string().contains("-g7-launcher"), "{err}");
        assert!(validate_name("mnist", 1024, 1024).is_ok());
    }

    #[test]
    fn names_that_cannot_name_a_service_are_rejected() {
        for name in ["1abc", "Abc", "ab_c", "abc-"] {
            assert!(validate_name(name, 1, 1).is_err(), "{name}");
        }
    }

    #[test]
    fn a_job_without_server_set_metadata_is_refused_naming_what_is_missing() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hybrid.yaml");
        let mut job: TrainingJob = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert!(validate(&job).is_ok());
        job.metadata.name = Some("mnist".to_owned());
        job.metadata.namespace = None;
        assert_eq!(validate(&job).unwrap_err(), ValidationError::Metadata("mnist".to_owned(), "namespace"));
        job.metadata.namespace = Some("ns".to_owned());
        job.metadata.uid = None;
        assert_eq!(validate(&job).unwrap_err(), ValidationError::Metadata("mnist".to_owned(), "uid"));
        job.metadata.uid = Some("u-1".to_owned());
        job.metadata.name = None;
        assert_eq!(validate(&job).unwrap_err(), ValidationError::Metadata(String::new(), "name"));
    }

    /// A name the CRD admits (at most `tandem_api::MAX_NAME` characters) fits every child's host
    /// name at the schema's largest groups, ranks and PS count: the CRD's bound is this check's.
    #[test]
    fn the_longest_name_the_crd_admits_fits_every_child_at_the_schemas_maxima() {
        use tandem_api::{MAX_GROUP_SIZE, MAX_GROUPS, MAX_NAME, MAX_PARAMETER_SERVERS};
        let name = "a".repeat(MAX_NAME);
        let (last_group, last_rank) = (MAX_GROUPS - 1, MAX_GROUP_SIZE - 1);
        for role in [
            Role::Launcher { group: last_group },
            Role::Worker { group: last_group, rank: last_rank },
            Role::Ps { index: MAX_PARAMETER_SERVERS - 1 },
        ] {
            let host = names::pod(&name, role);
            assert!(host.len() <= MAX_LABEL, "{host} has {} characters", host.len());
        }
        assert_eq!(names::pod(&name, Role::Launcher { group: last_group }).len(), MAX_LABEL);
        for group_size in [1, 4, MAX_GROUP_SIZE] {
            assert!(validate_name(&name, MAX_GROUPS, group_size).is_ok());
        }
        assert!(validate_name(&format!("{name}a"), MAX_GROUPS, 1).is_err());
    }

    #[test]
    fn a_users_command_is_validated_by_the_specs_rules() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/pytorch/job.yaml");
        let mut job: TrainingJob = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        job.metadata.namespace = Some("ns".to_owned());
        job.metadata.uid = Some("u-1".to_owned());
        assert!(validate(&job).is_ok());
        // With backend: mpi a launcher runs `mpirun <command>`; a model is still refused.
        job.spec.workers.backend = tandem_api::Backend::Mpi;
        job.spec.workers.min_groups = job.spec.workers.groups;
        job.spec.workers.max_groups = job.spec.workers.groups;
        assert!(validate(&job).is_ok(), "{:?}", validate(&job).err().map(|e| e.to_string()));
        job.spec.model.hidden = vec![64];
        let err = validate(&job).unwrap_err().to_string();
        assert!(err.contains("remove spec.model"), "{err}");
    }
}
