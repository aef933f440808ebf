//! The client of `callgrind.sh`: sends a known number of `POST /orders` requests, one at a
//! time on one keep-alive connection, so the server under callgrind can be measured per
//! request. It runs natively (outside valgrind); its own speed does not matter.
//!
//! usage: callgrind_client --addr HOST:PORT --body FILE --prefix P --count N
//!                         [--first K] [--cycle M]
//!
//! Request i (0-based) carries `Idempotency-Key: P-(K + i mod M)` (M defaults to N, K to
//! 1), `Authorization: Bearer bench` and the body. Every answer must be `201`; anything
//! else, or a closed connection, ends it with status 1.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;

struct Args {
    addr: String,
    body: Vec<u8>,
    prefix: String,
    count: u64,
    first: u64,
    cycle: Option<u64>,
}

fn parse_args() -> Result<Args, String> {
    let (mut addr, mut body, mut prefix, mut count) = (None, None, None, None);
    let (mut first, mut cycle) = (1, None);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|e| format!("{flag} {value}: {e}"))
        };
        match flag.as_str() {
            "--addr" => addr = Some(value.clone()),
            "--body" => {
                body = Some(std::fs::read(&value).map_err(|e| format!("{value}: {e}"))?);
            }
            "--prefix" => prefix = Some(value.clone()),
            "--count" => count = Some(number()?),
            "--first" => first = number()?,
            "--cycle" => cycle = Some(number()?.max(1)),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Args {
        addr: addr.ok_or("--addr is required")?,
        body: body.ok_or("--body is required")?,
        prefix: prefix.ok_or("--prefix is required")?,
        count: count.ok_or("--count is required")?,
        first,
        cycle,
    })
}

/// Reads one response; returns its status.
fn read_response(reader: &mut BufReader<TcpStream>) -> Result<u16, String> {
    let mut line = String::new();
    if reader.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
        return Err("connection closed".into());
    }
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or(format!("bad status line {line:?}"))?;
    let mut length = 0usize;
    loop {
        line.clear();
        reader.read_line(&mut line).map_err(|e| e.to_string())?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().map_err(|_| "bad content-length")?;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).map_err(|e| e.to_string())?;
    Ok(status)
}

fn run(args: &Args) -> Result<(), String> {
    let stream = TcpStream::connect(&args.addr).map_err(|e| format!("{}: {e}", args.addr))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut writer = stream.try_clone().map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(stream);
    let cycle = args.cycle.unwrap_or(args.count.max(1));
    let mut request = Vec::with_capacity(args.body.len() + 256);
    for i in 0..args.count {
        request.clear();
        write!(
            request,
            "POST /orders HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Authorization: Bearer bench\r\nIdempotency-Key: {}-{}\r\n\
             Content-Length: {}\r\n\r\n",
            args.addr,
            args.prefix,
            args.first + i % cycle,
            args.body.len()
        )
        .map_err(|e| e.to_string())?;
        request.extend_from_slice(&args.body);
        writer.write_all(&request).map_err(|e| e.to_string())?;
        let status = read_response(&mut reader)?;
        if status != 201 {
            return Err(format!("request {i}: status {status}"));
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let result = parse_args().and_then(|args| run(&args));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("callgrind_client: {e}");
            ExitCode::FAILURE
        }
    }
}
