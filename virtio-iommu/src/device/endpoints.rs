//! The table of endpoints the device manages (the endpoint type is in
//! `crate::endpoint`). Endpoints are registered by the host (never by the guest), so
//! the table is bounded by the host's `max_endpoints` limit.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use crate::endpoint::Endpoint;
use crate::locks::{read, write};

/// All endpoints by id.
#[derive(Default)]
pub struct EndpointTable {
    map: RwLock<HashMap<u32, Arc<Endpoint>>>,
}

impl EndpointTable {
    pub fn get(&self, id: u32) -> Option<Arc<Endpoint>> {
        read(&self.map).get(&id).cloned()
    }

    pub fn len(&self) -> usize {
        read(&self.map).len()
    }

    /// Inserts unless present; returns false if the id already exists.
    pub fn insert(&self, ep: Endpoint) -> bool {
        let mut m = write(&self.map);
        if m.contains_key(&ep.id()) {
            return false;
        }
        m.insert(ep.id(), Arc::new(ep));
        true
    }

    /// Forgets an endpoint (its function was unplugged); returns it.
    pub fn remove(&self, id: u32) -> Option<Arc<Endpoint>> {
        write(&self.map).remove(&id)
    }

    pub fn all(&self) -> Vec<Arc<Endpoint>> {
        read(&self.map).values().cloned().collect()
    }
}
