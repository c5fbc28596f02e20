//! `gwjob agent`: one per node. Registers the node with the job server,
//! heartbeats, and does what the replies ask: open a job's rendezvous store,
//! start its workers, stop them. Worker exits go back in the heartbeats.
//!
//! Pieces: [`args`] (command line), [`link`] (talking to the server, with
//! backoff and an outbox of undelivered news), [`workers`] (processes),
//! [`stores`] (rendezvous stores). This file is the loop that ties them
//! together on the main thread, woken by SIGCHLD, SIGINT/SIGTERM (see
//! [`gw_launch::signals`]) or the next deadline, so every decision is
//! taken in one place and in order.
//!
//! Why the loop is shaped as it is:
//! - the server may vanish at any moment; the workers must not notice. A
//!   failed call only pushes the next one back (backoff), and an answer of
//!   404 ("unknown node") means the server lost us: register again and
//!   re-announce the open stores;
//! - news is urgent (a worker exit may fail a job; a store address unblocks
//!   a launch), so a heartbeat goes out at once when there is any, instead
//!   of waiting for the next period;
//! - SIGINT/SIGTERM stop the workers (SIGKILL after the grace period, or at
//!   a second signal), report their exits once, close the stores, and exit.

pub mod args;
pub mod link;
pub mod stores;
pub mod workers;

use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use gw_jobapi::http::HttpError;
use gw_jobapi::types::{HeartbeatReply, RegisterNode, Role, StoreOpened};

use gw_launch::remove_shm_files;
use gw_launch::signals::{Signals, signal_name};
use link::{Backoff, Link, Outbox};
use stores::Stores;
use workers::Workers;

/// Exit status for usage errors (a bad command line, which `gwjob` reports
/// before the agent starts).
pub const EXIT_USAGE: i32 = 2;
/// Exit status when the agent itself fails (signals, a refused registration).
pub const EXIT_INTERNAL: i32 = 1;
/// Longest sleep of the loop when nothing wakes it.
const TICK: Duration = Duration::from_millis(500);
/// Backoff between failed calls to the server.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// `gwjob agent`'s entry, with options already checked: runs the agent
/// until SIGINT/SIGTERM (0) or a fatal error (1, logged).
pub fn run(o: args::Options) -> i32 {
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cannot install signal handlers: {e}");
            return EXIT_INTERNAL;
        }
    };
    let ip = o.addr.unwrap_or_else(|| link::route_addr(&o.server));
    let node = RegisterNode {
        node: o.node.clone(),
        rack: o.rack.clone(),
        slots: o.slots,
        device_type: o.device_type.clone(),
        addr: ip.to_string(),
    };
    tracing::info!(
        "node {} (rack {}, {} slot{}, {}) at {ip}, server {}",
        o.node,
        o.rack,
        o.slots,
        if o.slots == 1 { "" } else { "s" },
        o.device_type,
        o.server
    );
    let mut agent = Agent {
        link: Link::new(&o.server, &o.token, node),
        ip,
        registered: false,
        period: Duration::from_secs(1),
        next_contact: Instant::now(),
        backoff: Backoff::new(BACKOFF_FIRST, BACKOFF_MAX),
        down_since: None,
        outbox: Outbox::default(),
        workers: Workers::new(workers::STOP_GRACE),
        stores: Stores::default(),
        shutting_down: false,
        signalled_before: false,
        ever_registered: false,
    };
    let code = agent.run(&mut signals);
    agent.stores.close_all();
    drop(signals);
    code
}

struct Agent {
    link: Link,
    /// Address stores bind and advertise.
    ip: IpAddr,
    registered: bool,
    /// Heartbeat period the server asked for.
    period: Duration,
    next_contact: Instant,
    backoff: Backoff,
    /// When the server stopped answering (for one log line per outage).
    down_since: Option<Instant>,
    outbox: Outbox,
    workers: Workers,
    stores: Stores,
    shutting_down: bool,
    /// A SIGINT/SIGTERM arrived before (the next one kills the workers).
    signalled_before: bool,
    /// Registered at least once (a refusal is fatal only before that).
    ever_registered: bool,
}

impl Agent {
    fn run(&mut self, signals: &mut Signals) -> i32 {
        loop {
            let now = Instant::now();
            self.collect(now);

            if let Some((count, sig)) = signals.take_terminate() {
                let name = signal_name(sig);
                if !self.shutting_down {
                    tracing::info!(
                        "received {name}; stopping {} worker(s)",
                        self.workers.running()
                    );
                    self.shutting_down = true;
                    self.workers.stop_all();
                }
                if count > 1 || self.workers.running() > 0 && self.signalled_before {
                    tracing::warn!("received {name} again; killing the workers");
                    self.workers.kill_all();
                }
                self.signalled_before = true;
            }
            if self.shutting_down && self.workers.running() == 0 {
                self.collect(Instant::now());
                self.last_word();
                return 0;
            }

            if now >= self.next_contact
                && let Err(e) = self.contact()
            {
                tracing::error!("{e}");
                self.workers.stop_all();
                self.workers.kill_all();
                return EXIT_INTERNAL;
            }

            let now = Instant::now();
            let mut wake = self.next_contact.min(now + TICK);
            if let Some(t) = self.workers.escalate(now) {
                wake = wake.min(t);
            }
            if let (_, Some(t)) = self.stores.tick(now) {
                wake = wake.min(t);
            }
            signals.wait(wake.saturating_duration_since(now));
        }
    }

    /// Reaps exited workers into the outbox and retires finished jobs.
    fn collect(&mut self, now: Instant) {
        let exits = self.workers.reap();
        if !exits.is_empty() && self.down_since.is_none() {
            self.next_contact = now; // news: tell the server now
        }
        self.outbox.exits.extend(exits);
        for f in self.workers.take_finished() {
            if f.stopped {
                self.stores.close(&f.job_id);
                remove_shm_files(Path::new("/dev/shm"), &f.job_id);
            } else {
                self.stores.close_at(&f.job_id, now + stores::LINGER);
            }
        }
    }

    /// One exchange with the server. `Err` only for a registration the
    /// server refuses before this agent was ever registered (a wrong token
    /// or a bad node description: retrying cannot help).
    fn contact(&mut self) -> Result<(), String> {
        if !self.registered {
            match self.link.register() {
                Ok((period, role)) => {
                    tracing::info!(
                        "registered node {} with {} (heartbeat every {} ms)",
                        self.link.node.node,
                        self.link.server,
                        period.as_millis()
                    );
                    if role == Some(Role::Admin) {
                        // Whoever breaks into this node gets the whole
                        // cluster: the admin token runs programs everywhere.
                        tracing::warn!(
                            "this agent runs with the admin token, which can run any program \
                             on every node; give it its own with `gwjob node-token --node {}`",
                            self.link.node.node
                        );
                    }
                    self.registered = true;
                    self.ever_registered = true;
                    self.period = period;
                    // A server that forgot us forgot our stores too.
                    let open: Vec<StoreOpened> = self
                        .stores
                        .all()
                        .map(|(j, attempt, a)| StoreOpened {
                            job_id: j.to_owned(),
                            attempt,
                            addr: a.to_owned(),
                        })
                        .collect();
                    for s in open {
                        self.outbox.push_store(s);
                    }
                }
                Err(e) if !self.ever_registered && !e.is_transient() => {
                    return Err(format!("the job server refused to register this node: {e}"));
                }
                Err(e) => {
                    self.failed(&e);
                    return Ok(());
                }
            }
        }
        let sent = self.outbox.heartbeat();
        match self.link.heartbeat(&sent) {
            Ok(reply) => {
                self.outbox.delivered(&sent);
                self.recovered();
                self.next_contact = Instant::now() + self.period;
                self.handle(reply);
                if !self.outbox.is_empty() {
                    self.next_contact = Instant::now();
                }
            }
            Err(e) if link::is_unknown_node(&e) => {
                tracing::warn!(
                    "the job server does not know node {} ({e}); registering again",
                    self.link.node.node
                );
                self.registered = false;
                self.next_contact = Instant::now() + self.backoff.fail();
            }
            Err(e) => self.failed(&e),
        }
        Ok(())
    }

    /// Does what a heartbeat reply asks.
    fn handle(&mut self, reply: HeartbeatReply) {
        if !self.shutting_down {
            for os in &reply.open_stores {
                let before = self.stores.addr(&os.job_id).map(str::to_owned);
                match self
                    .stores
                    .open(&os.job_id, os.attempt, &os.store_token, self.ip)
                {
                    Ok(addr) => {
                        if before.as_deref() != Some(addr.as_str()) {
                            tracing::info!(
                                "opened the rendezvous store of job {} at {addr}",
                                os.job_id
                            );
                        }
                        self.outbox.push_store(StoreOpened {
                            job_id: os.job_id.clone(),
                            attempt: os.attempt,
                            addr,
                        });
                    }
                    Err(e) => tracing::warn!("job {}: {e}", os.job_id),
                }
            }
            for l in &reply.launches {
                if reply.stops.contains(&l.job_id) {
                    continue;
                }
                let failed = self.workers.launch(l, &self.link.server);
                self.outbox.exits.extend(failed);
            }
        }
        for job in &reply.stops {
            if self.workers.stop(job) {
                tracing::info!("stopping job {job} (the server asked)");
                self.stores.close(job);
                remove_shm_files(Path::new("/dev/shm"), job);
            }
        }
    }

    fn failed(&mut self, e: &HttpError) {
        let now = Instant::now();
        if self.down_since.is_none() {
            if matches!(
                e,
                HttpError::Status {
                    status: 401 | 403,
                    ..
                }
            ) {
                // After a revocation the operator needs to know it is the
                // token, not the network, that keeps this node out.
                tracing::warn!(
                    "the job server refuses this agent's token ({e}): revoked or replaced? \
                     retrying with backoff, workers keep running"
                );
            } else {
                tracing::warn!(
                    "job server unreachable ({e}); retrying with backoff, workers keep running"
                );
            }
            self.down_since = Some(now);
        }
        self.next_contact = now + self.backoff.fail();
    }

    fn recovered(&mut self) {
        self.backoff.reset();
        if let Some(t) = self.down_since.take() {
            tracing::info!("job server back after {:.1} s", t.elapsed().as_secs_f64());
        }
    }

    /// Before exiting: one try to deliver the workers' exits.
    fn last_word(&mut self) {
        if !self.registered || self.outbox.is_empty() {
            return;
        }
        let sent = self.outbox.heartbeat();
        if let Err(e) = self.link.heartbeat(&sent) {
            tracing::warn!("could not report the last worker exits: {e}");
        }
    }
}
