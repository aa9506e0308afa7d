//! The CRD's CEL rules, evaluated in-process on the generated schema (defaults applied first, as
//! the API server does): every invalid fixture is refused with its intended message, every
//! example is accepted, and `TrainingJobSpec::validate` (the local runner's check) agrees.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests fail loudly by design

use crate::common;

use kube_cel::Validator;
use serde_json::Value;
use tandem_api::{TrainingJob, TrainingJobSpec};

fn schema() -> Value {
    let crd = serde_json::to_value(tandem_api::crd::as_written()).expect("CRD serialises");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

fn manifest(text: &str) -> Value {
    serde_yaml::from_str(text).expect("fixture is YAML")
}

fn cel_errors(object: &Value, old: Option<&Value>) -> Vec<String> {
    match Validator::new().validate(&schema(), object, old) {
        Ok(()) => Vec::new(),
        Err(errors) => errors.iter().map(|e| e.message.clone()).collect(),
    }
}

#[test]
fn every_invalid_fixture_is_refused_with_its_message() {
    let fixtures = common::invalid_fixtures();
    assert!(fixtures.len() >= 8, "expected at least 8 invalid fixtures, found {}", fixtures.len());
    for (path, text) in fixtures {
        let expected = common::expected_message(&path, &text);
        let errors = cel_errors(&manifest(&text), None);
        assert!(
            errors.iter().any(|m| m.contains(&expected)),
            "{}: expected a CEL error containing {expected:?}, got {errors:?}",
            path.display()
        );
    }
}

#[test]
fn invalid_fixtures_break_distinct_rules() {
    let messages: std::collections::BTreeSet<String> =
        common::invalid_fixtures().iter().map(|(p, t)| common::expected_message(p, t)).collect();
    assert!(messages.len() >= 8, "only {} distinct rules exercised: {messages:?}", messages.len());
}

#[test]
fn every_example_is_accepted() {
    let examples = common::examples();
    assert!(examples.len() >= 4, "examples/ should hold the documented manifests");
    for (path, text) in examples {
        let errors = cel_errors(&manifest(&text), None);
        assert!(errors.is_empty(), "{} refused: {errors:?}", path.display());
    }
}

#[test]
fn local_validation_agrees_with_the_crd() {
    for (path, text) in common::invalid_fixtures() {
        let expected = common::expected_message(&path, &text);
        let err =
            tandem_api::manifest::parse(&text).expect_err(&format!("{} should be invalid", path.display()));
        assert!(
            err.to_string().contains(&expected),
            "{}: local check said {err:?}, CRD says {expected:?}",
            path.display(),
        );
    }
    for (path, text) in common::examples() {
        let job: TrainingJob = serde_yaml::from_str(&text).expect("example parses");
        job.spec.validate().unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

#[test]
fn backend_and_algorithm_cannot_change_on_update() {
    let (_, text) =
        common::examples().into_iter().find(|(p, _)| p.ends_with("mnist-hybrid.yaml")).expect("hybrid");
    let old = manifest(&text);
    let mut new = old.clone();
    new["spec"]["workers"]["backend"] = Value::from("mpi");
    let errors = cel_errors(&new, Some(&old));
    assert!(errors.iter().any(|m| m.contains("workers.backend cannot change")), "{errors:?}");

    let mut new = old.clone();
    new["spec"]["training"]["algorithm"] = Value::from("easgd");
    let errors = cel_errors(&new, Some(&old));
    assert!(errors.iter().any(|m| m.contains("training.algorithm cannot change")), "{errors:?}");

    // Scaling within bounds is an allowed update.
    let mut new = old.clone();
    new["spec"]["workers"]["groups"] = Value::from(4);
    assert_eq!(cel_errors(&new, Some(&old)), Vec::<String>::new());
}

#[test]
fn defaults_fill_an_omitted_section() {
    let job: TrainingJob = serde_yaml::from_str(
        "apiVersion: tandem.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: x}\nspec:\n  training: {steps: 10}\n  parameterServers: {replicas: 1}\n",
    )
    .expect("minimal job parses");
    let spec: &TrainingJobSpec = &job.spec;
    assert_eq!(spec.workers.groups, 1);
    assert_eq!(spec.workers.max_groups, 8);
    assert_eq!(spec.data.batch_size, 64);
    assert_eq!(spec.training.algorithm, tandem_api::Algorithm::Hybrid);
    assert_eq!(spec.run_policy.max_restarts, 5);
    spec.validate().expect("the minimal hybrid job is valid");
}
