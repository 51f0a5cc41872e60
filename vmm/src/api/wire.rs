//! The bytes on the API socket: requests as `dbs-uhttp` (the Firecracker
//! micro-http lineage, which cloud-hypervisor's server also comes from)
//! parses them, replies framed exactly as cloud-hypervisor's server frames
//! them, because its clients read them with a few string searches:
//!
//! - the status line is `HTTP/1.1 200 \r\n`, code and no reason phrase
//!   (`ch-remote` parses everything after `HTTP/1.1 ` up to the CR as the
//!   number, trimmed);
//! - a body always comes with `Content-Length` and never chunked (the
//!   clients read exactly that many bytes, or stop at the blank line when
//!   there is none, as for a 204);
//! - `Connection: keep-alive`.
//!
//! WHY the reply is serialised here and not by `dbs_uhttp::Response`: that
//! type only knows a fixed list of codes, and the API answers 409 for a
//! second `vm.create`. The framing is the library's (a test compares the
//! two byte for byte for a code both know); parsing stays the library's.

use std::fs::File;
use std::io::Write;

use dbs_uhttp::{Request, RequestError};

use super::routes::Reply;

/// What the `Server` header names.
pub const SERVER: &str = "dmavisor API";

/// A parsed request, owned, to be answered on the server loop or handed
/// to the worker thread.
#[derive(Debug)]
pub struct Incoming {
    /// `GET`, `PUT`, ...
    pub method: &'static str,
    /// The request target's path and query.
    pub url: String,
    /// The body (`Content-Length` bytes; empty without one).
    pub body: Vec<u8>,
    /// Descriptors that came with the request's bytes (`SCM_RIGHTS`).
    pub fds: Vec<File>,
}

impl Incoming {
    /// Takes `req` apart; a request the API cannot answer gets its reply
    /// instead (`Err`), after which the connection is closed: the bytes
    /// that follow cannot be framed.
    pub fn from_request(req: Request) -> Result<Self, Reply> {
        if req.headers.chunked() {
            return Err(Reply::error(
                400,
                "chunked request bodies are not supported; send Content-Length",
            ));
        }
        Ok(Self {
            method: req.method().to_str(),
            url: req.uri().get_abs_path().to_string(),
            body: req.body.map(|b| b.body).unwrap_or_default(),
            fds: req.files,
        })
    }
}

/// The reply to a request the parser refused: 413 for a body over the
/// limit, 400 for anything else malformed.
pub fn refused(e: &RequestError) -> Reply {
    match e {
        RequestError::SizeLimitExceeded(limit, got) => Reply::error(
            413,
            format!("request body of {got} bytes is larger than {limit} bytes"),
        ),
        other => Reply::error(400, format!("malformed request: {other}")),
    }
}

/// The bytes of `reply`.
pub fn encode(reply: &Reply) -> Vec<u8> {
    let body = reply.body.as_deref().unwrap_or("");
    let mut out = Vec::with_capacity(128 + body.len());
    // Writes to a Vec cannot fail.
    let _ = write!(
        out,
        "HTTP/1.1 {} \r\nServer: {SERVER}\r\nConnection: keep-alive\r\n",
        reply.status
    );
    if !body.is_empty() {
        let _ = write!(
            out,
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        );
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use dbs_uhttp::{Body, MediaType, Response, StatusCode, Version};

    use super::*;
    use crate::api::routes::After;

    #[test]
    fn framing_is_the_micro_http_lineages() {
        let reply = Reply::error(404, "no endpoint /x");
        let mut theirs = Response::new(Version::Http11, StatusCode::NotFound);
        theirs.set_server(SERVER);
        theirs.set_content_type(MediaType::ApplicationJson);
        theirs.set_body(Body::new(reply.body.clone().unwrap_or_default()));
        let mut bytes = Vec::new();
        theirs.write_all(&mut bytes).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&encode(&reply)),
            String::from_utf8_lossy(&bytes)
        );
        let empty = Reply {
            status: 204,
            body: None,
            after: After::Nothing,
        };
        let mut theirs = Response::new(Version::Http11, StatusCode::NoContent);
        theirs.set_server(SERVER);
        let mut bytes = Vec::new();
        theirs.write_all(&mut bytes).unwrap();
        assert_eq!(encode(&empty), bytes);
    }

    #[test]
    fn oversized_bodies_are_413() {
        assert_eq!(
            refused(&RequestError::SizeLimitExceeded(65536, 65537)).status,
            413
        );
        assert_eq!(refused(&RequestError::InvalidRequest).status, 400);
    }
}
