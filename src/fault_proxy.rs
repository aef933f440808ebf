//! A fault-injecting TCP proxy on loopback, in front of a demo instance (the chaos check)
//! or of the demo's gateway (the client half's tests). Each connection draws
//! one fate (the client opens one connection per request, so each request does):
//!
//! - **pass**: relayed both ways;
//! - **dropped**: the request is read and the connection closed; the server never sees it;
//! - **cut in flight**: the whole request is forwarded, then both connections are closed
//!   while the handler runs (the server sees its client vanish);
//! - **answer lost**: the whole request is forwarded, the server starts answering, and
//!   both connections are closed without relaying a byte of the answer;
//! - **stalled**: the request is held longer than the client waits, then delivered; the
//!   client has given up (and retried) by the time the server answers, and that late
//!   answer is discarded.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How often each fault is injected, in percent of connections.
#[derive(Debug, Clone, Copy)]
pub struct FaultRates {
    /// Requests read and dropped before the server sees them.
    pub dropped: u32,
    /// Connections cut while the handler runs.
    pub cut_in_flight: u32,
    /// Answers discarded after the server sent them.
    pub answer_lost: u32,
    /// Requests held past the client's timeout, then delivered.
    pub stalled: u32,
    /// How long a stalled request is held (longer than the client's timeout).
    pub stall: Duration,
}

#[derive(Debug, Clone, Copy)]
enum Fate {
    Pass,
    Dropped,
    CutInFlight,
    AnswerLost,
    Stalled,
}

/// What the proxies did, counted across all of them.
#[derive(Debug, Default)]
pub struct ProxyStats {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections relayed both ways.
    pub passed: AtomicU64,
    /// Requests dropped (see [`FaultRates::dropped`]).
    pub dropped: AtomicU64,
    /// Connections cut in flight.
    pub cut_in_flight: AtomicU64,
    /// Answers lost.
    pub answer_lost: AtomicU64,
    /// Requests stalled.
    pub stalled: AtomicU64,
    /// Connections still being handled (a stalled request may outlive its client).
    pub active: AtomicU64,
}

impl ProxyStats {
    /// The value of one of the counters.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::SeqCst)
    }
}

/// Starts a proxy to `upstream` on a free loopback port; returns its address. The proxy
/// runs until the runtime stops.
pub async fn start(
    upstream: SocketAddr,
    rates: FaultRates,
    stats: Arc<ProxyStats>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            stats.connections.fetch_add(1, Ordering::SeqCst);
            stats.active.fetch_add(1, Ordering::SeqCst);
            let fate = draw(&rates);
            let stats = stats.clone();
            tokio::spawn(async move {
                let counter = match fate {
                    Fate::Pass => &stats.passed,
                    Fate::Dropped => &stats.dropped,
                    Fate::CutInFlight => &stats.cut_in_flight,
                    Fate::AnswerLost => &stats.answer_lost,
                    Fate::Stalled => &stats.stalled,
                };
                // A fault counts once it was applied as described.
                if handle(client, upstream, fate, rates.stall).await.is_ok() {
                    counter.fetch_add(1, Ordering::SeqCst);
                }
                stats.active.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    Ok(addr)
}

fn draw(rates: &FaultRates) -> Fate {
    let mut roll = rand::rng().random_range(0..100u32);
    for (rate, fate) in [
        (rates.dropped, Fate::Dropped),
        (rates.cut_in_flight, Fate::CutInFlight),
        (rates.answer_lost, Fate::AnswerLost),
        (rates.stalled, Fate::Stalled),
    ] {
        if roll < rate {
            return fate;
        }
        roll -= rate;
    }
    Fate::Pass
}

async fn handle(
    mut client: TcpStream,
    upstream: SocketAddr,
    fate: Fate,
    stall: Duration,
) -> std::io::Result<()> {
    if let Fate::Pass = fate {
        let mut server = TcpStream::connect(upstream).await?;
        tokio::io::copy_bidirectional(&mut client, &mut server).await?;
        return Ok(());
    }
    let request = read_request(&mut client).await?;
    match fate {
        Fate::Pass => unreachable!("handled above"),
        // Closing without forwarding: the request never reaches the server.
        Fate::Dropped => Ok(()),
        Fate::CutInFlight => {
            let mut server = TcpStream::connect(upstream).await?;
            server.write_all(&request).await?;
            server.flush().await?;
            // Long enough for the server to read the request and start the handler.
            let settle = Duration::from_millis(rand::rng().random_range(5..30));
            tokio::time::sleep(settle).await;
            Ok(())
        }
        Fate::AnswerLost => {
            let mut server = TcpStream::connect(upstream).await?;
            server.write_all(&request).await?;
            first_answer_bytes(&mut server).await
        }
        Fate::Stalled => {
            tokio::time::sleep(stall).await;
            let mut server = TcpStream::connect(upstream).await?;
            server.write_all(&request).await?;
            drop(client);
            first_answer_bytes(&mut server).await
        }
    }
}

/// Waits until the server starts answering (so the request reached it whole), and reads
/// nothing more.
async fn first_answer_bytes(server: &mut TcpStream) -> std::io::Result<()> {
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(30), server.read(&mut buf)).await;
    match read {
        Ok(Ok(1)) => Ok(()),
        _ => Err(std::io::Error::other("no answer")),
    }
}

/// Reads one whole HTTP/1.1 request: the head up to the blank line, then
/// `Content-Length` bytes of body.
async fn read_request(client: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        loop {
            if let Some(head_end) = find(&request, b"\r\n\r\n") {
                let length = content_length(&request[..head_end]);
                if request.len() >= head_end + 4 + length {
                    return Ok(());
                }
            }
            if request.len() > 1 << 20 {
                return Err(std::io::Error::other("request too large"));
            }
            match client.read(&mut buf).await? {
                0 => return Err(std::io::Error::other("client closed mid-request")),
                n => request.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .map_err(|_| std::io::Error::other("request timed out"))??;
    Ok(request)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn content_length(head: &[u8]) -> usize {
    String::from_utf8_lossy(head)
        .lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.trim().parse().ok())
        .unwrap_or(0)
}
