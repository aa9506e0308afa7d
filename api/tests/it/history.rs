//! `status.history`: the training curve the operator keeps for `kubectl tandem plot`.

use tandem_api::{HISTORY_POINTS, Progress, TrainingJobStatus};

fn at(step: u64, loss: f64) -> Progress {
    Progress { step, loss: Some(loss), ..Progress::default() }
}

fn steps(status: &TrainingJobStatus) -> Vec<u64> {
    status.history.iter().map(|p| p.step).collect()
}

#[test]
fn a_step_appends_a_point_and_a_repeated_step_replaces_it() {
    let mut status = TrainingJobStatus::default();
    status.record_history(&at(10, 2.0));
    status.record_history(&at(20, 1.5));
    status.record_history(&Progress {
        step: 20,
        loss: Some(1.4),
        accuracy: Some(0.6),
        ..Progress::default()
    });
    assert_eq!(steps(&status), [10, 20]);
    assert_eq!((status.history[1].loss, status.history[1].accuracy), (Some(1.4), Some(0.6)));
}

#[test]
fn a_restart_from_an_earlier_step_drops_the_points_past_it() {
    let mut status = TrainingJobStatus::default();
    for step in [10, 20, 30, 40] {
        status.record_history(&at(step, 1.0));
    }
    status.record_history(&at(25, 0.9));
    assert_eq!(steps(&status), [10, 20, 25]);
}

#[test]
fn a_full_history_thins_its_older_half_and_keeps_the_first_and_newest_points() {
    let mut status = TrainingJobStatus::default();
    for step in 1..=10 * HISTORY_POINTS as u64 {
        status.record_history(&at(step, 1.0 / step as f64));
    }
    let kept = steps(&status);
    assert!(kept.len() <= HISTORY_POINTS, "{} points", kept.len());
    assert!(kept.len() > HISTORY_POINTS / 2, "{} points", kept.len());
    assert_eq!(kept[0], 1, "the run's start stays");
    assert_eq!(*kept.last().unwrap(), 10 * HISTORY_POINTS as u64);
    assert!(kept.windows(2).all(|w| w[0] < w[1]), "in step order: {kept:?}");
    let json = serde_json::to_string(&status).unwrap();
    assert!(json.len() < 8 * 1024, "a full history is a few KiB of status, not {} bytes", json.len());
}
