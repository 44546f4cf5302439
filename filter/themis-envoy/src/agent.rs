//! The two answers the filter reads from its local agent (over the agent cluster):
//! a service's instances and the workload's key. The agent verified the records
//! already; the filter still checks what it relies on (each instance's key hashes to
//! its id in this mesh, the key is the workload's), so a confused agent cannot make
//! it talk to the wrong peer.

use std::net::SocketAddr;

use serde::Deserialize;
use themis_core::{Identity, MeshName, PeerId};

/// One instance of a service: who must answer, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// The id the key agreement must authenticate.
    pub id: PeerId,
    /// The peer's inbound listener.
    pub endpoint: SocketAddr,
}

/// Why an agent answer was not usable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AgentError {
    /// Not the JSON expected.
    #[error("the agent's answer does not parse: {0}")]
    Json(String),
    /// An instance whose public key does not hash to its id, or of another mesh.
    #[error("the agent returned an instance whose key does not match its id")]
    KeyIdMismatch,
    /// The key material does not parse, or is for another workload or mesh.
    #[error("the agent's key material is unusable: {0}")]
    Key(String),
}

#[derive(Deserialize)]
struct Resolution {
    instances: Vec<RawInstance>,
}

#[derive(Deserialize)]
struct RawInstance {
    id: String,
    public_key: String,
    endpoint: SocketAddr,
}

/// Reads `GET /v1/services/{service}`.
pub fn parse_instances(body: &[u8], mesh: &MeshName) -> Result<Vec<Instance>, AgentError> {
    let resolution: Resolution =
        serde_json::from_slice(body).map_err(|e| AgentError::Json(e.to_string()))?;
    resolution
        .instances
        .into_iter()
        .map(|raw| {
            let id = PeerId::parse_in(&raw.id, mesh).map_err(|_| AgentError::KeyIdMismatch)?;
            let key: [u8; 32] = hex::decode(&raw.public_key)
                .ok()
                .and_then(|k| k.try_into().ok())
                .ok_or(AgentError::KeyIdMismatch)?;
            if PeerId::derive(&key, mesh.as_str()) != id {
                return Err(AgentError::KeyIdMismatch);
            }
            Ok(Instance {
                id,
                endpoint: raw.endpoint,
            })
        })
        .collect()
}

#[derive(Deserialize)]
struct KeyMaterial {
    workload: String,
    mesh: String,
    id: String,
    private_key_pem: String,
}

/// Reads `GET /v1/workloads/{workload}/key` into the workload's identity.
pub fn parse_identity(
    body: &[u8],
    workload: &str,
    mesh: &MeshName,
) -> Result<Identity, AgentError> {
    let key: KeyMaterial =
        serde_json::from_slice(body).map_err(|e| AgentError::Json(e.to_string()))?;
    if key.workload != workload || key.mesh != mesh.as_str() {
        return Err(AgentError::Key(format!(
            "it is for workload {} in mesh {}, not {workload} in {}",
            key.workload,
            key.mesh,
            mesh.as_str()
        )));
    }
    let identity = Identity::from_key_file(mesh.clone(), &key.private_key_pem)
        .map_err(|e| AgentError::Key(e.to_string()))?;
    if identity.printable_id() != key.id {
        return Err(AgentError::Key(
            "the private key does not match the id".into(),
        ));
    }
    Ok(identity)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh() -> MeshName {
        MeshName::new("demo").unwrap()
    }

    #[test]
    fn instances_are_checked_against_their_keys() {
        let rng = ring::rand::SystemRandom::new();
        let peer = Identity::generate(mesh(), &rng).unwrap();
        let other = Identity::generate(mesh(), &rng).unwrap();
        let answer = |id: &str, key: &[u8; 32]| {
            format!(
                r#"{{"service":"check","instances":[{{"id":"{id}","public_key":"{}","endpoint":"127.0.0.12:15006","metadata":{{}}}}],"cached":false,"refused":0}}"#,
                hex::encode(key)
            )
        };
        let good = answer(&peer.printable_id(), peer.public_key());
        assert_eq!(
            parse_instances(good.as_bytes(), &mesh()).unwrap(),
            vec![Instance {
                id: peer.id(),
                endpoint: "127.0.0.12:15006".parse().unwrap()
            }]
        );
        let swapped = answer(&peer.printable_id(), other.public_key());
        assert_eq!(
            parse_instances(swapped.as_bytes(), &mesh()),
            Err(AgentError::KeyIdMismatch)
        );
        let foreign = MeshName::new("other").unwrap();
        assert_eq!(
            parse_instances(good.as_bytes(), &foreign),
            Err(AgentError::KeyIdMismatch)
        );
        assert!(matches!(
            parse_instances(b"{", &mesh()),
            Err(AgentError::Json(_))
        ));
    }

    #[test]
    fn key_material_must_be_the_workloads() {
        let rng = ring::rand::SystemRandom::new();
        let me = Identity::generate(mesh(), &rng).unwrap();
        let body = |workload: &str, id: &str| {
            serde_json::json!({
                "workload": workload, "mesh": "demo", "id": id,
                "public_key": hex::encode(me.public_key()),
                "private_key_pem": me.to_key_file().as_str(),
            })
            .to_string()
        };
        let ok = parse_identity(
            body("check", &me.printable_id()).as_bytes(),
            "check",
            &mesh(),
        );
        assert_eq!(ok.unwrap().id(), me.id());
        assert!(parse_identity(
            body("other", &me.printable_id()).as_bytes(),
            "check",
            &mesh()
        )
        .is_err());
        let wrong_id = Identity::generate(mesh(), &rng).unwrap().printable_id();
        assert!(parse_identity(body("check", &wrong_id).as_bytes(), "check", &mesh()).is_err());
    }
}
