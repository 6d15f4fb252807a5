//! A minimal blocking HTTP/1.1 client (plain `http://` only), enough for `--peer` (a
//! replica's `GET /dump`) and for tests and scripts that talk to the service without an
//! HTTP stack of their own.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// An HTTP answer.
#[derive(Debug, Clone)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON.
    pub fn json(&self) -> Result<serde_json::Value, String> {
        serde_json::from_slice(&self.body).map_err(|e| format!("{e}: {}", self.text()))
    }
}

/// `http://host:port` and the path of `url` (default `/`).
fn split(url: &str) -> Result<(&str, &str), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url:?}: only http:// URLs are supported"))?;
    Ok(match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    })
}

/// Sends `method` to `url` (`http://host:port/path`) with `body` (JSON when given) and
/// reads the whole answer, within `timeout` per read or write.
pub fn request(
    method: &str,
    url: &str,
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<Response, String> {
    let (host, path) = split(url)?;
    let mut s = TcpStream::connect(host).map_err(|e| format!("connect {host}: {e}"))?;
    s.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    let body = body.unwrap_or(b"");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).map_err(|e| format!("send to {host}: {e}"))?;
    // A server may answer (413) and close before reading a large body: keep what it said.
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    if let Err(e) = s.read_to_end(&mut raw)
        && raw.is_empty()
    {
        return Err(format!("read from {host}: {e}"));
    }
    parse(&raw)
}

/// `GET url`.
pub fn get(url: &str) -> Result<Response, String> {
    request("GET", url, None, Duration::from_secs(30))
}

/// `POST url` with a JSON body.
pub fn post_json(url: &str, body: &serde_json::Value) -> Result<Response, String> {
    let b = serde_json::to_vec(body).map_err(|e| e.to_string())?;
    request("POST", url, Some(&b), Duration::from_secs(30))
}

/// A kept-alive HTTP/1.1 connection, for many requests in a row (each answer must carry a
/// `Content-Length`, as the service's do).
pub struct Connection {
    host: String,
    stream: std::io::BufReader<TcpStream>,
}

impl Connection {
    /// Connects to `base` (`http://host:port`).
    pub fn open(base: &str) -> Result<Connection, String> {
        let (host, _) = split(base)?;
        let s = TcpStream::connect(host).map_err(|e| format!("connect {host}: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
        let _ = s.set_nodelay(true);
        Ok(Connection { host: host.to_owned(), stream: std::io::BufReader::new(s) })
    }

    /// Sends `method path` with an optional JSON body and reads the answer.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<Response, String> {
        use std::io::BufRead;
        let body = body.unwrap_or(b"");
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        let s = self.stream.get_mut();
        s.write_all(head.as_bytes()).and_then(|()| s.write_all(body)).map_err(|e| e.to_string())?;
        let mut raw = Vec::new();
        loop {
            let n = self.stream.read_until(b'\n', &mut raw).map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("connection closed".into());
            }
            if raw.ends_with(b"\r\n\r\n") {
                break;
            }
        }
        let head = String::from_utf8_lossy(&raw).to_ascii_lowercase();
        let len = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .ok_or("an answer without a content-length")?;
        let at = raw.len();
        raw.resize(at + len, 0);
        self.stream.read_exact(&mut raw[at..]).map_err(|e| e.to_string())?;
        parse(&raw)
    }

    /// `POST path` with a JSON body.
    pub fn post_json(&mut self, path: &str, body: &serde_json::Value) -> Result<Response, String> {
        let b = serde_json::to_vec(body).map_err(|e| e.to_string())?;
        self.request("POST", path, Some(&b))
    }
}

fn parse(raw: &[u8]) -> Result<Response, String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| "an answer without a header end".to_string())?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad status line in {head:?}"))?;
    let mut chunked = false;
    let mut length = None;
    for l in lines {
        let Some((k, v)) = l.split_once(':') else { continue };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
            chunked = true;
        } else if k == "content-length" {
            length = v.parse::<usize>().ok();
        }
    }
    let rest = &raw[end + 4..];
    let body = if chunked {
        dechunk(rest)?
    } else {
        match length {
            Some(n) if n <= rest.len() => rest[..n].to_vec(),
            Some(n) => return Err(format!("body cut short: {} of {n} bytes", rest.len())),
            None => rest.to_vec(),
        }
    };
    Ok(Response { status, body })
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n").ok_or("bad chunk header")?;
        let size = String::from_utf8_lossy(&b[..eol]);
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| format!("bad chunk size {size:?}"))?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if b.len() < size + 2 {
            return Err("chunk cut short".into());
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}
