use super::*;

#[test]
fn requests_round_trip_with_their_version() {
    let req = Request::Cancel {
        id: 3,
        grace_s: None,
    };
    let mut buf = Vec::new();
    write_frame(&mut buf, &req, Path::new("x")).unwrap();
    assert_eq!(
        buf,
        format!("{{\"v\":{VERSION},\"op\":\"cancel\",\"id\":3}}\n").as_bytes()
    );
    let back: Request = read_frame(&buf[..], Path::new("x")).unwrap();
    assert_eq!(back, req);
}

#[test]
fn garbage_wrong_versions_and_oversize_lines_are_errors() {
    let p = Path::new("x");
    assert!(matches!(
        read_frame::<Request>(&b"\x00\xffhello\n"[..], p),
        Err(ProtocolError::BadFrame(_))
    ));
    assert!(matches!(
        read_frame::<Request>(
            format!("{{\"v\":{},\"op\":\"queue\"}}\n", VERSION + 1).as_bytes(),
            p
        ),
        Err(ProtocolError::Version(v)) if v == VERSION + 1
    ));
    assert!(matches!(
        read_frame::<Request>(
            format!("{{\"v\":{VERSION},\"op\":\"explode\"}}\n").as_bytes(),
            p
        ),
        Err(ProtocolError::BadFrame(_))
    ));
    assert!(matches!(
        read_frame::<Request>(
            format!("{{\"v\":{VERSION},\"op\":\"queue\"}}").as_bytes(),
            p
        ),
        Err(ProtocolError::Closed)
    ));
    let big = vec![b' '; MAX_FRAME + 10];
    assert!(matches!(
        read_frame::<Request>(&big[..], p),
        Err(ProtocolError::Oversize)
    ));
}

#[test]
fn the_previous_versions_request_is_refused_with_an_error_naming_both_versions() {
    let old = VERSION - 1;
    let line = format!("{{\"v\":{old},\"op\":\"queue\"}}\n");
    let e = read_request(line.as_bytes(), Path::new("x")).unwrap_err();
    assert!(matches!(e, ProtocolError::Version(v) if v == old), "{e:?}");
    assert!(
        e.to_string().starts_with(&format!(
            "protocol version {old}, expected {VERSION} (the client and the scheduler"
        )),
        "{e}"
    );
}

#[test]
fn a_job_query_naming_too_many_jobs_is_refused_and_its_filters_are_optional() {
    let p = Path::new("x");
    let q: Request = read_request(
        format!("{{\"v\":{VERSION},\"op\":\"jobs\"}}\n").as_bytes(),
        p,
    )
    .unwrap();
    assert_eq!(q, Request::Jobs(JobQuery::default()));
    let many = Request::Jobs(JobQuery {
        ids: (0..=MAX_QUERY_IDS as u64).collect(),
        ..JobQuery::default()
    });
    assert_eq!(
        many.validate(),
        Err(RequestError::TooManyIds {
            ids: MAX_QUERY_IDS + 1
        })
    );
}

fn submit_frame(gpu_mem_mib: u64) -> String {
    format!(
        "{{\"v\":{VERSION},\"op\":\"submit\",\"command\":[\"true\"],\"cwd\":\"/\",\
         \"gpu_mem_mib\":{gpu_mem_mib},\"gpus\":1,\"feed\":null,\"thread_percentage\":null}}\n"
    )
}

#[test]
fn a_submit_stating_more_than_16_tebibytes_per_gpu_is_refused_with_a_typed_error() {
    let p = Path::new("x");
    let absurd = submit_frame(u64::MAX);
    match read_request(absurd.as_bytes(), p) {
        Err(ProtocolError::Invalid(RequestError::GpuMemoryOutOfRange { mib })) => {
            assert_eq!(mib, u64::MAX);
        }
        other => panic!("{other:?}"),
    }
    let e = read_request(submit_frame(MAX_MIB + 1).as_bytes(), p).unwrap_err();
    assert!(
        e.to_string().contains("gpu_mem_mib") && e.to_string().contains("16 TiB"),
        "{e}"
    );
    let Request::Submit(spec) = read_request(submit_frame(MAX_MIB).as_bytes(), p).unwrap() else {
        panic!("not a submit");
    };
    assert_eq!(spec.gpu_mem_mib, Some(MAX_MIB));
}

#[test]
fn environment_variables_no_process_can_take_are_refused() {
    let spec = |name: &str, value: &str| {
        Request::Submit(JobSpec {
            command: vec!["true".into()],
            cwd: "/".into(),
            gpu_mem_mib: None,
            gpus: 1,
            feed: None,
            thread_percentage: None,
            env: vec![(name.into(), value.into())],
            whole_env: true,
            cpus: None,
            host_mem_mib: None,
            family: None,
        })
    };
    assert_eq!(spec("LADLE_SOCKET", "/tmp/s.sock").validate(), Ok(()));
    // A whole environment is bounded.
    let big = "x".repeat(MAX_ENV_BYTES);
    assert_eq!(
        spec("HUGE", &big).validate(),
        Err(RequestError::EnvironmentTooLarge {
            bytes: MAX_ENV_BYTES + 6
        })
    );
    assert_eq!(spec("FITS", &big[..MAX_ENV_BYTES - 6]).validate(), Ok(()));
    for (name, value) in [("", "x"), ("A=B", "x"), ("A\0", "x"), ("A", "x\0y")] {
        assert!(
            matches!(
                spec(name, value).validate(),
                Err(RequestError::BadEnvironment { .. })
            ),
            "{name:?}={value:?}"
        );
    }
}
