//! The communicator's notice board in the rendezvous store.
//!
//! Transports only tell a rank about the peers it exchanges bytes with. Two
//! kinds of failure need more: a rank that fails must reach every rank, not
//! only its neighbours; and ranks that called different collectives may never
//! exchange a single frame (each waits to receive from the other), so no
//! fingerprint ever gets compared. While an operation is stalled, the engine
//! therefore posts what it is doing here and reads what the others are
//! doing; a rank that failed posts why. This costs nothing while operations
//! make progress.

use crate::op::Fingerprint;
use gw_rendezvous::StoreClient;
use gw_transport::{Rank, Result};

/// Store keys of one communicator.
pub(crate) struct Board {
    store: StoreClient,
    prefix: String,
    world: u32,
}

/// What another rank is doing, as posted.
pub(crate) struct Doing {
    pub rank: Rank,
    pub seq: u64,
    pub what: String,
}

impl Board {
    pub fn new(store: StoreClient, prefix: String, world: u32) -> Board {
        Board {
            store,
            prefix,
            world,
        }
    }

    fn abort_key(&self) -> String {
        format!("{}/abort", self.prefix)
    }

    fn doing_key(&self, r: Rank) -> String {
        format!("{}/doing/{r}", self.prefix)
    }

    /// The first failure any rank posted.
    pub fn failure(&mut self) -> Result<Option<String>> {
        let key = self.abort_key();
        Ok(self
            .store
            .get(&key)?
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// Posts this rank's failure, unless one is posted already.
    pub fn post_failure(&mut self, reason: &str) -> Result<()> {
        let key = self.abort_key();
        if self.store.get(&key)?.is_none() {
            self.store.set(&key, reason.as_bytes())?;
        }
        Ok(())
    }

    /// Posts the operation this rank is stalled in.
    pub fn post_doing(&mut self, me: Rank, fp: &Fingerprint) -> Result<()> {
        let key = self.doing_key(me);
        Ok(self
            .store
            .set(&key, format!("{};{fp}", fp.seq).as_bytes())?)
    }

    /// What every other rank last posted.
    pub fn others(&mut self, me: Rank) -> Result<Vec<Doing>> {
        let mut out = Vec::new();
        for r in (0..self.world).filter(|&r| r != me) {
            let key = self.doing_key(r);
            if let Some(v) = self.store.get(&key)? {
                let v = String::from_utf8_lossy(&v);
                if let Some((seq, what)) = v.split_once(';')
                    && let Ok(seq) = seq.parse()
                {
                    out.push(Doing {
                        rank: r,
                        seq,
                        what: what.to_string(),
                    });
                }
            }
        }
        Ok(out)
    }
}
