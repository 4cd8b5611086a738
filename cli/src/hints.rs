//! What to do about an error whose own words come from a library or a registry rather than
//! from gpusnap: printed as a `hint:` line under the error, at the binary's edge.

/// The hint for `err` (its whole chain, `{:#}`), if one applies.
pub fn for_error(err: &str) -> Option<&'static str> {
    // rustls reading a plain-HTTP answer as a TLS record.
    if err.contains("InvalidContentType") || err.contains("invalid TLS record") {
        return Some(
            "the registry answered in plain HTTP, not HTTPS: pass --plain-http if it serves \
             plain HTTP on purpose (a registry on loopback or a private network), else check \
             the address and port",
        );
    }
    // The registry's own answer to plain HTTP on its TLS port (Go's net/http, nginx).
    if err.contains("Client sent an HTTP request to an HTTPS server")
        || err.contains("The plain HTTP request was sent to HTTPS port")
    {
        return Some(
            "the registry speaks HTTPS: drop --plain-http (and give its CA with --ca-file PEM \
             when its certificate is not signed by a CA this node trusts)",
        );
    }
    if err.contains("UnknownIssuer") || err.contains("invalid peer certificate") {
        return Some(
            "the registry's certificate is not signed by a CA this node trusts: give its CA \
             with --ca-file PEM",
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::for_error;

    #[test]
    fn scheme_mismatches_get_the_flag_to_change() {
        let tls = "GET https://r:5000/v2/: error sending request: client error (Connect): \
                   received corrupt message of type InvalidContentType";
        assert!(for_error(tls).unwrap().contains("--plain-http"));
        let plain = "GET http://r:5000/v2/x/manifests/v1 returned HTTP 400: Client sent an \
                     HTTP request to an HTTPS server.";
        assert!(for_error(plain).unwrap().contains("drop --plain-http"));
        assert!(for_error("manifest unknown").is_none());
    }
}
