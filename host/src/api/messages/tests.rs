use super::*;

fn ws(n: u8) -> WorkspaceId {
    WorkspaceId::parse(&format!("ws_{n:02x}")).unwrap()
}

fn position() -> MessageCursor {
    MessageCursor {
        created_at: DateTime::parse_from_rfc3339("2025-03-01T10:20:30.123456Z")
            .unwrap()
            .with_timezone(&Utc),
        event_id: EventId::generate(),
    }
}

fn record(i: i64) -> MessageRecord {
    MessageRecord {
        event_id: EventId::parse(&format!("evt_{i:032x}")).unwrap(),
        event_name: "order-shipped".into(),
        subscriber_id: "sub".into(),
        priority: 2,
        status: MessageStatus::Queued,
        attempts: 0,
        cost_micro_usd: 0,
        test_mode: false,
        variables_keys: vec!["a".into()],
        created_at: DateTime::from_timestamp(1_700_000_000 - i, 0).unwrap(),
        updated_at: DateTime::from_timestamp(1_700_000_000 - i, 0).unwrap(),
        category: None,
        channel: Some("email".into()),
        provider: None,
        provider_message_id: None,
        error_code: None,
        error_detail: None,
        timeline: None,
    }
}

#[test]
fn event_ids_in_evt_and_uuid_forms() {
    let id = "evt_0123456789abcdef0123456789abcdef";
    assert_eq!(parse_event_id(id).unwrap().as_str(), id);
    for uuid in [
        "01234567-89ab-cdef-0123-456789abcdef",
        "01234567-89AB-CDEF-0123-456789ABCDEF",
        "0123456789abcdef0123456789abcdef",
        "{01234567-89ab-cdef-0123-456789abcdef}",
        "urn:uuid:01234567-89ab-cdef-0123-456789abcdef",
    ] {
        assert_eq!(parse_event_id(uuid).unwrap().as_str(), id, "{uuid}");
    }
    for bad in [
        "",
        "evt_",
        "evt_XYZ",
        "evt_0123456789ABCDEF",
        "ws_0123",
        "hello",
        "01234567-89ab-cdef-0123-456789abcde",
        "01234567-89ab-cdef-0123-456789abcdefg",
    ] {
        assert!(parse_event_id(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn list_query_defaults_and_filters() {
    let q = parse_list_query(None).unwrap();
    assert_eq!(q.limit, 50);
    assert_eq!(q.filter, MessageFilter::default());
    assert_eq!(q.cursor, None);
    let q = parse_list_query(Some(
        "status=bounced_hard&channel=SMS&subscriber=ada&from=2025-01-01T00:00:00Z&to=2025-01-02T00:00:00%2B02:00&limit=7&cursor=abc&page=3&status_x=1",
    ))
    .unwrap();
    assert_eq!(q.filter.status, Some(MessageStatus::BouncedHard));
    assert_eq!(q.filter.channel.as_deref(), Some("sms"));
    assert_eq!(q.filter.subscriber_id.as_deref(), Some("ada"));
    assert_eq!(
        q.filter.to.unwrap().to_rfc3339(),
        "2025-01-01T22:00:00+00:00"
    );
    assert_eq!((q.limit, q.cursor.as_deref()), (7, Some("abc")));
    // An unescaped `+` of the offset arrives as a space.
    let q = parse_list_query(Some("from=2025-01-01T02:00:00+02:00")).unwrap();
    assert_eq!(
        q.filter.from.unwrap().to_rfc3339(),
        "2025-01-01T00:00:00+00:00"
    );
    assert_eq!(
        parse_list_query(Some("status=SENT")).unwrap().filter.status,
        Some(MessageStatus::Sent)
    );
    assert_eq!(
        parse_list_query(Some("subscriber_id=a&subscriber=a"))
            .unwrap()
            .filter
            .subscriber_id
            .as_deref(),
        Some("a")
    );
    let q = parse_list_query(Some("")).unwrap();
    assert_eq!((q.filter.status, q.limit, q.cursor), (None, 50, None));
    assert_eq!(parse_list_query(Some("limit=0")).unwrap().limit, 0);
    assert_eq!(parse_list_query(Some("limit=100")).unwrap().limit, 100);
    let same = parse_list_query(Some("from=2025-01-01T00:00:00Z&to=2025-01-01T00:00:00Z"));
    assert!(same.is_ok());
}

#[test]
fn list_query_rejections() {
    for bad in [
        "limit=101",
        "limit=-1",
        "limit=abc",
        "limit=1.5",
        "limit=+5",
        "limit=99999999999",
        "status=sending",
        "status=Sent",
        "channel=fax",
        "channel=Sms",
        "subscriber_id=a&subscriber=b",
        "from=yesterday",
        "to=2025-01-01",
        "from=2025-01-02T00:00:00Z&to=2025-01-01T00:00:00Z",
        "status=SENT&status=FAILED",
        "subscriber_id=%01",
        "subscriber_id=%20%20",
        "to=",
        "status=&limit=10",
        "cursor=",
    ] {
        assert!(parse_list_query(Some(bad)).is_err(), "{bad}");
    }
    let long = format!("subscriber_id={}", "a".repeat(257));
    assert!(parse_list_query(Some(&long)).is_err());
}

#[test]
fn cursor_round_trip() {
    let digest = filter_digest(&ws(1), &MessageFilter::default());
    let p = position();
    let c = encode_cursor(&p, digest);
    assert!(
        c.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
        "{c}"
    );
    assert_eq!(decode_cursor(&c, digest).unwrap(), p);
    // Before the epoch, too.
    let old = MessageCursor {
        created_at: DateTime::from_timestamp_micros(-1_234_567).unwrap(),
        event_id: EventId::parse("evt_a").unwrap(),
    };
    assert_eq!(
        decode_cursor(&encode_cursor(&old, digest), digest).unwrap(),
        old
    );
}

#[test]
fn any_changed_character_is_refused() {
    let digest = filter_digest(&ws(1), &MessageFilter::default());
    let c = encode_cursor(&position(), digest);
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    for i in 0..c.len() {
        for &replacement in alphabet {
            if replacement == c.as_bytes()[i] {
                continue;
            }
            let mut tampered = c.clone().into_bytes();
            tampered[i] = replacement;
            let tampered = String::from_utf8(tampered).unwrap();
            assert_eq!(
                decode_cursor(&tampered, digest),
                Err(CursorError::Malformed),
                "position {i} -> {}",
                replacement as char
            );
        }
    }
    for bad in [
        "",
        "abc",
        "!!!!",
        &c[..c.len() - 1],
        &format!("{c}A"),
        &"A".repeat(500),
    ] {
        assert!(decode_cursor(bad, digest).is_err(), "{bad}");
    }
}

#[test]
fn a_cursor_is_bound_to_its_filters_and_workspace() {
    let none = MessageFilter::default();
    let sms = MessageFilter {
        channel: Some("sms".into()),
        ..Default::default()
    };
    let c = encode_cursor(&position(), filter_digest(&ws(1), &none));
    assert_eq!(
        decode_cursor(&c, filter_digest(&ws(1), &sms)),
        Err(CursorError::OtherFilters)
    );
    assert_eq!(
        decode_cursor(&c, filter_digest(&ws(2), &none)),
        Err(CursorError::OtherFilters)
    );
    let from = MessageFilter {
        from: Some(DateTime::from_timestamp(1, 0).unwrap()),
        ..Default::default()
    };
    let from2 = MessageFilter {
        from: Some(DateTime::from_timestamp(1, 1).unwrap()),
        ..Default::default()
    };
    assert_ne!(filter_digest(&ws(1), &from), filter_digest(&ws(1), &from2));
    // Values cannot be shifted between fields.
    let a = MessageFilter {
        channel: Some("sms".into()),
        ..Default::default()
    };
    let b = MessageFilter {
        subscriber_id: Some("sms".into()),
        ..Default::default()
    };
    assert_ne!(filter_digest(&ws(1), &a), filter_digest(&ws(1), &b));
}

#[test]
fn pages_carry_a_cursor_only_when_more_rows_exist() {
    let digest = [7; 8];
    let rows: Vec<_> = (0..4).map(record).collect();
    let full = page(rows.clone(), 3, digest);
    assert_eq!(full.messages.len(), 3);
    let cursor = decode_cursor(full.next_cursor.as_deref().unwrap(), digest).unwrap();
    assert_eq!(cursor.event_id, rows[2].event_id);
    assert_eq!(cursor.created_at, rows[2].created_at);
    let last = page(rows[..3].to_vec(), 3, digest);
    assert_eq!((last.messages.len(), last.next_cursor), (3, None));
    let empty = page(Vec::new(), 0, digest);
    assert!(empty.messages.is_empty() && empty.next_cursor.is_none());
}

#[test]
fn message_dto_omits_absent_fields() {
    let mut r = record(1);
    r.timeline = Some(vec![TimelineEntry {
        seq: 1,
        status: StepStatus::Queued,
        occurred_at: r.created_at,
        provider: None,
        detail: Some(serde_json::json!({"channel": "email"})),
    }]);
    let v = serde_json::to_value(MessageDto::from(r)).unwrap();
    assert_eq!(v["priority"], 2);
    assert_eq!(v["status"], "QUEUED");
    assert_eq!(v["created_at"], "2023-11-14T22:13:19.000000Z");
    assert_eq!(v["events"][0]["status"], "queued");
    assert_eq!(v["events"][0]["detail"]["channel"], "email");
    assert!(v["events"][0].get("provider").is_none());
    for absent in ["category", "provider", "provider_message_id", "error_code"] {
        assert!(v.get(absent).is_none(), "{absent}");
    }
    let listed = serde_json::to_value(MessageDto::from(record(2))).unwrap();
    assert!(listed.get("events").is_none());
}
