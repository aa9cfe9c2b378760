//! Request errors, rendered in the shape of the API that was called: OpenAI's
//! `{"error": {"message", "type", "param", "code"}}` or Anthropic's
//! `{"type": "error", "error": {"type", "message"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    OpenAi,
    Anthropic,
}

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    pub fn with_param(mut self, p: impl Into<String>) -> Self {
        self.param = Some(p.into());
        self
    }

    pub fn with_code(mut self, c: &'static str) -> Self {
        self.code = Some(c);
        self
    }

    fn openai_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            400 | 413 | 422 => "invalid_request_error",
            503 => "server_overloaded",
            _ => "server_error",
        }
    }

    fn anthropic_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            400 | 422 => "invalid_request_error",
            _ => "api_error",
        }
    }

    /// The error body as JSON in `flavor`'s shape.
    pub fn body(&self, flavor: Flavor) -> serde_json::Value {
        match flavor {
            Flavor::OpenAi => json!({"error": {
                "message": self.message,
                "type": self.openai_type(),
                "param": self.param,
                "code": self.code,
            }}),
            Flavor::Anthropic => json!({"type": "error", "error": {
                "type": self.anthropic_type(),
                "message": self.message,
            }}),
        }
    }

    pub fn into_response_as(self, flavor: Flavor) -> Response {
        let mut r = (self.status, axum::Json(self.body(flavor))).into_response();
        if let Some(s) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        r
    }
}

/// An [`ApiError`] answered in OpenAI's shape.
pub struct OaiError(pub ApiError);
/// An [`ApiError`] answered in Anthropic's shape.
pub struct AntError(pub ApiError);

impl IntoResponse for OaiError {
    fn into_response(self) -> Response {
        self.0.into_response_as(Flavor::OpenAi)
    }
}

impl IntoResponse for AntError {
    fn into_response(self) -> Response {
        self.0.into_response_as(Flavor::Anthropic)
    }
}

impl From<ApiError> for OaiError {
    fn from(e: ApiError) -> Self {
        OaiError(e)
    }
}

impl From<ApiError> for AntError {
    fn from(e: ApiError) -> Self {
        AntError(e)
    }
}
