//! Consistency modes of real `tandem ps` processes on loopback, with several worker groups of
//! several ranks each pushing and pulling ranges that straddle shard boundaries.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use crate::ps_common::{Job, addrs, eventually};
use tandem_ps::client::PsClient;
use tandem_ps::wire::Progress;

/// Each rank's chunk of an 11-value vector (as after a reduce-scatter of 2): 0..4 and 4..11,
/// while the 2 shards hold 0..6 and 6..11, so rank 1 talks to both shards.
const TOTAL: u64 = 11;
const CHUNKS: [(u64, u64); 2] = [(0, 4), (4, 11)];

fn init() -> Vec<f32> {
    (0..TOTAL).map(|i| i as f32).collect()
}

#[test]
fn sync_applies_the_mean_of_every_group_once_per_step_across_shards() {
    let job = Job::with_group_size("ps-sync", 0, 2, 0, 2);
    let ps = [job.spawn_ps(0, 0), job.spawn_ps(1, 0)];
    let servers = addrs(&ps);
    let groups = 3u32;
    let steps = 12u64;
    let mut handles = Vec::new();
    let joined = Arc::new(Barrier::new((groups * 2) as usize));
    for g in 0..groups {
        // The group's ranks meet after each pull, as they would in their allgather.
        let allgather = Arc::new(Barrier::new(2));
        for r in 0..2u32 {
            let servers = servers.clone();
            let allgather = allgather.clone();
            let joined = joined.clone();
            let mut client = job.worker(&servers, g, r, TOTAL);
            handles.push(std::thread::spawn(move || {
                let (a, b) = CHUNKS[r as usize];
                client.init(a, &init()[a as usize..b as usize]).unwrap();
                client.join().unwrap();
                joined.wait();
                let mut w = vec![0.0; (b - a) as usize];
                client.pull(a, &mut w).unwrap();
                assert_eq!(w, init()[a as usize..b as usize].to_vec());
                for t in 0..steps {
                    // Group g's gradient at step t: (g + 1)·(t + 1) everywhere.
                    let grad = vec![((g + 1) as f32) * (t + 1) as f32; w.len()];
                    client.push(t, a, &grad).unwrap();
                    client.pull(a, &mut w).unwrap();
                    // Sync: after step t every group sees exactly the mean of all groups' gradients
                    // of steps 0..=t subtracted, never a partial step.
                    let mean_g = (1..=groups).sum::<u32>() as f32 / groups as f32;
                    let applied: f32 = (0..=t).map(|s| mean_g * (s + 1) as f32).sum();
                    let want: Vec<f32> = init()[a as usize..b as usize].iter().map(|x| x - applied).collect();
                    assert_eq!(w, want, "group {g} rank {r} step {t}");
                    allgather.wait();
                }
                client
                    .report(Progress {
                        step: steps,
                        loss: Some(0.1),
                        accuracy: Some(0.9),
                        samples: 64 * steps,
                        epoch: 0,
                        ..Progress::default()
                    })
                    .unwrap();
            }));
        }
    }
    for h in handles {
        h.join().unwrap();
    }
    let mut observer = job.observer(&servers);
    for i in 0..2 {
        let status = observer.status(i).unwrap();
        assert_eq!(status["version"], steps, "shard {i} applied one update per step");
        assert_eq!(status["progress"]["accuracy"], 0.9);
    }
}

#[test]
fn bounded_staleness_holds_a_fast_group_until_the_slowest_moves() {
    let job = Job::new("ps-async", 1, 1, 0);
    let ps = [job.spawn_ps(0, 0)];
    let servers = addrs(&ps);
    let mut fast = job.worker(&servers, 0, 0, 4);
    let mut slow = job.worker(&servers, 1, 0, 4);
    let mut observer = job.observer(&servers);
    fast.init(0, &[0.0; 4]).unwrap();
    fast.join().unwrap();
    slow.join().unwrap();
    let mut w = [0.0f32; 4];
    // One step ahead of the slowest is within s = 1.
    fast.push(0, 0, &[1.0; 4]).unwrap();
    fast.pull(0, &mut w).unwrap();
    assert_eq!(w, [-1.0; 4], "async applies a push at once");
    // A second step would put it two ahead: its pull waits.
    fast.push(1, 0, &[1.0; 4]).unwrap();
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let mut w = [0.0f32; 4];
        let r = fast.pull(0, &mut w).map(|_| w);
        tx.send(r.is_ok()).unwrap();
        (fast, r.unwrap())
    });
    eventually("the fast group's pull to wait at the server", || {
        observer.status(0).unwrap()["waiting_pulls"] == 1
    });
    assert!(rx.try_recv().is_err(), "the pull must not be answered while the group is 2 steps ahead");
    slow.push(0, 0, &[1.0; 4]).unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(60)), Ok(true));
    let (_fast, w) = waiter.join().unwrap();
    assert_eq!(w, [-3.0; 4], "released with every contribution applied");
    let status = observer.status(0).unwrap();
    assert_eq!(status["version"], 3);
    let clocks: Vec<u64> =
        status["groups"].as_array().unwrap().iter().map(|g| g["clock"].as_u64().unwrap()).collect();
    assert_eq!(clocks, vec![2, 1]);
}

#[test]
fn async_with_a_loose_bound_never_waits_for_an_idle_group() {
    let job = Job::new("ps-async", 1000, 2, 0);
    let ps = [job.spawn_ps(0, 0), job.spawn_ps(1, 0)];
    let servers = addrs(&ps);
    let mut busy = job.worker(&servers, 0, 0, TOTAL);
    let mut idle = job.worker(&servers, 1, 0, TOTAL);
    busy.init(0, &init()).unwrap();
    busy.join().unwrap();
    idle.join().unwrap();
    let mut w = vec![0.0; TOTAL as usize];
    for t in 1..=25 {
        busy.push(t - 1, 0, &vec![0.5; TOTAL as usize]).unwrap();
        let version = busy.pull(0, &mut w).unwrap();
        assert_eq!(version, t);
    }
    assert_eq!(w, init().iter().map(|x| x - 12.5).collect::<Vec<_>>());
    idle.pull(0, &mut w).unwrap();
    assert_eq!(w[0], -12.5, "the idle group reads the busy group's updates");
}

#[test]
fn groups_join_with_current_weights_and_sync_stops_waiting_for_groups_that_leave() {
    let job = Job::new("ps-sync", 0, 2, 0);
    let ps = [job.spawn_ps(0, 0), job.spawn_ps(1, 0)];
    let servers = addrs(&ps);
    let mut a = job.worker(&servers, 0, 0, TOTAL);
    let mut b = job.worker(&servers, 1, 0, TOTAL);
    a.init(0, &init()).unwrap();
    a.join().unwrap();
    b.join().unwrap();
    let n = TOTAL as usize;
    let mut w = vec![0.0; n];
    let mut wb = vec![0.0; n];
    // One synchronous step of two groups; each group's push-then-pull runs in its own thread.
    let step_both =
        |x: &mut PsClient, gx: f32, wx: &mut Vec<f32>, y: &mut PsClient, gy: f32, wy: &mut Vec<f32>| {
            std::thread::scope(|s| {
                s.spawn(|| {
                    y.push(0, 0, &vec![gy; n]).unwrap();
                    y.pull(0, wy).unwrap();
                });
                x.push(0, 0, &vec![gx; n]).unwrap();
                x.pull(0, wx).unwrap();
            });
        };
    // Two groups, two steps: the mean of 1 and 3 is 2 per step.
    for _ in 0..2 {
        step_both(&mut a, 1.0, &mut w, &mut b, 3.0, &mut wb);
        assert_eq!(w, wb);
    }
    assert_eq!(w[0], -4.0);

    // Group 2 joins mid-training: it pulls what the others see and is waited for from now on.
    let mut c = job.worker(&servers, 2, 0, TOTAL);
    c.join().unwrap();
    let mut wc = vec![0.0; n];
    c.pull(0, &mut wc).unwrap();
    assert_eq!(wc, w);

    // Group 1 leaves at a step boundary; groups 0 and 2 step on without it.
    b.leave().unwrap();
    step_both(&mut a, 1.0, &mut w, &mut c, 5.0, &mut wc);
    assert_eq!(w, wc);
    assert_eq!(w[0], -7.0, "mean of 1 and 5 applied; the group that left was not waited for");

    // A group whose connections close leaves too: group 0 goes on alone.
    drop(c);
    drop(b);
    let mut observer = job.observer(&servers);
    eventually("group 2 to leave when its connections close", || {
        let s = observer.status(0).unwrap();
        s["groups"].as_array().unwrap().iter().filter(|g| g["member"] == true).count() == 1
    });
    a.push(0, 0, &vec![1.0; n]).unwrap();
    a.pull(0, &mut w).unwrap();
    assert_eq!(w[0], -8.0);
}

#[test]
fn easgd_moves_the_centre_by_each_elastic_difference() {
    let job = Job::new("easgd", 0, 2, 0);
    let ps = [job.spawn_ps(0, 0), job.spawn_ps(1, 0)];
    let servers = addrs(&ps);
    let n = TOTAL as usize;
    let alpha = 0.5f32;
    let mut workers: Vec<_> = (0..2).map(|g| job.worker(&servers, g, 0, TOTAL)).collect();
    workers[0].init(0, &vec![0.0; n]).unwrap();
    for w in &mut workers {
        w.join().unwrap();
    }
    // Local models of the two groups, far apart; each exchange moves worker and centre toward each other.
    let mut local = [vec![4.0f32; n], vec![-2.0f32; n]];
    let mut centre = vec![0.0f32; n];
    for round in 0..3 {
        for g in 0..2 {
            let mut c = vec![0.0; n];
            workers[g].pull(0, &mut c).unwrap();
            assert_eq!(c, centre, "round {round} group {g} reads the centre");
            let e: Vec<f32> = local[g].iter().zip(&c).map(|(x, c)| alpha * (x - c)).collect();
            local[g].iter_mut().zip(&e).for_each(|(x, e)| *x -= e);
            workers[g].push(round, 0, &e).unwrap();
            centre.iter_mut().zip(&e).for_each(|(c, e)| *c += e);
        }
    }
    let mut c = vec![0.0; n];
    workers[1].pull(0, &mut c).unwrap();
    assert_eq!(c, centre);
    assert!(c[0] > 0.0 && c[0] < 4.0, "the centre lies between the workers: {}", c[0]);
}
