//! What a `POST /v1/predict` carries: the image file's bytes as the body (`curl --data-binary
//! @picture.png`), or a `multipart/form-data` form (`curl -F image=@picture.png`, an HTML form,
//! most HTTP libraries' file upload), whose part named `image` or `file`, else its first part
//! with a file name, else its only part, is the image. The form is parsed from the body the
//! endpoint already read under its size and time limits.

use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::http::header::CONTENT_TYPE;

/// The image in a request's body; an error says what is wrong with a form.
pub async fn image_of(headers: &HeaderMap, body: Bytes) -> Result<Bytes, String> {
    let content_type = (headers.get(CONTENT_TYPE)).and_then(|v| v.to_str().ok());
    let Some(content_type) = content_type.filter(|t| is_form(t)) else {
        return Ok(body);
    };
    let boundary = multer::parse_boundary(content_type)
        .map_err(|e| format!("a multipart/form-data body needs a boundary: {e}"))?;
    let stream = futures_util::stream::once(async move { Ok::<_, std::convert::Infallible>(body) });
    let mut form = multer::Multipart::new(stream, boundary);
    let mut chosen: Option<(u8, Bytes)> = None;
    let mut parts = 0;
    while let Some(field) = (form.next_field().await).map_err(|e| format!("the form: {e}"))? {
        parts += 1;
        // Lower is better: the part named for the image, a file, any part.
        let rank = match (field.name(), field.file_name()) {
            (Some("image" | "file"), _) => 0,
            (_, Some(_)) => 1,
            _ => 2,
        };
        let bytes = (field.bytes().await).map_err(|e| format!("the form: {e}"))?;
        if chosen.as_ref().is_none_or(|(best, _)| rank < *best) {
            chosen = Some((rank, bytes));
        }
    }
    match chosen {
        Some((rank, bytes)) if rank < 2 || parts == 1 => Ok(bytes),
        Some(_) => Err(format!(
            "the form has {parts} parts and none is named image or file or carries a file name: \
             send the picture as -F image=@picture.png"
        )),
        None => Err("the form has no part: send the picture as -F image=@picture.png".into()),
    }
}

/// Whether a `Content-Type` is a form upload.
fn is_form(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("multipart/form-data")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(boundary: &str, parts: &[(&str, Option<&str>, &[u8])]) -> (HeaderMap, Bytes) {
        let mut body = Vec::new();
        for (name, file, data) in parts {
            body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
            let file = file
                .map(|f| format!("; filename=\"{f}\""))
                .unwrap_or_default();
            let disposition = format!("Content-Disposition: form-data; name=\"{name}\"{file}\r\n");
            body.extend_from_slice(disposition.as_bytes());
            body.extend_from_slice(b"Content-Type: application/octet-stream\r\n\r\n");
            body.extend_from_slice(data);
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
        let mut headers = HeaderMap::new();
        let value = format!("multipart/form-data; boundary={boundary}");
        headers.insert(CONTENT_TYPE, value.parse().unwrap());
        (headers, Bytes::from(body))
    }

    #[tokio::test]
    async fn the_image_part_of_a_form_is_taken_and_a_plain_body_is_the_image() {
        let png: &[u8] = b"\x89PNG\r\n\x1a\n--not-a-boundary\r\n";
        let (headers, body) = form(
            "xyz",
            &[("note", None, b"hello"), ("image", Some("a.png"), png)],
        );
        assert_eq!(image_of(&headers, body).await.unwrap(), png);
        let (headers, body) = form("b", &[("upload", Some("b.jpg"), b"jpeg bytes")]);
        assert_eq!(image_of(&headers, body).await.unwrap(), &b"jpeg bytes"[..]);
        // Not a form: the body as it came.
        let plain = Bytes::from_static(b"raw bytes");
        let got = image_of(&HeaderMap::new(), plain.clone()).await.unwrap();
        assert_eq!(got, plain);
        // Forms that name no image are refused with what to send.
        let (headers, body) = form("c", &[("a", None, b"1"), ("b", None, b"2")]);
        let err = image_of(&headers, body).await.unwrap_err();
        assert!(err.contains("-F image=@"), "{err}");
        let (headers, _) = form("d", &[]);
        let err = image_of(&headers, Bytes::from_static(b"--d\r\ngarbage")).await;
        assert!(err.is_err());
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, "multipart/form-data".parse().unwrap());
        let err = image_of(&headers, Bytes::new()).await.unwrap_err();
        assert!(err.contains("boundary"), "{err}");
    }
}
