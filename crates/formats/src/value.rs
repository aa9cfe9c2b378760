//! GGUF metadata: the 13 value types, typed arrays, and the ordered key → value map with
//! typed getters.
//!
//! The getters are lenient about integer width because llama.cpp-era writers disagree
//! (the same key is u32 in one converter, i32 or u64 in another): any integer type is
//! accepted when the value converts without loss. Floats accept f32 and f64.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::error::GgufError;

/// A metadata value type tag as stored in the file (u32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        use ValueType::*;
        match self {
            U8 => 0,
            I8 => 1,
            U16 => 2,
            I16 => 3,
            U32 => 4,
            I32 => 5,
            F32 => 6,
            Bool => 7,
            String => 8,
            Array => 9,
            U64 => 10,
            I64 => 11,
            F64 => 12,
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// Encoded size of a fixed-width scalar; `None` for strings and arrays.
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// Fewest bytes one value of this type can occupy: bounds element counts read from a
    /// file against the bytes left before anything is allocated.
    pub(crate) fn min_size(self) -> usize {
        match self {
            ValueType::String => 8,    // u64 length, empty text
            ValueType::Array => 4 + 8, // element type + count, no elements
            t => t.fixed_size().unwrap_or(1),
        }
    }
}

impl std::fmt::Display for ValueType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A homogeneous metadata array. Elements of `Array::Array` are themselves arrays, each
/// with its own element type (the spec allows nesting; tokenizers never use it).
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Type for messages: `u32`, `array[string]`, `array[array[f32]]`, ...
    pub fn type_desc(&self) -> String {
        match self {
            Value::Array(a) => a.type_desc(),
            v => v.value_type().name().to_string(),
        }
    }

    /// Bytes of the encoded payload (after the u32 type tag).
    pub fn encoded_len(&self) -> u64 {
        match self {
            Value::String(s) => 8 + s.len() as u64,
            Value::Array(a) => a.encoded_len(),
            v => v.value_type().fixed_size().unwrap_or(0) as u64,
        }
    }

    /// The value as an integer when it is one of the eight integer types.
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl Array {
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn type_desc(&self) -> String {
        match self {
            // An empty array of arrays has no inner type to name.
            Array::Array(v) => match v.first() {
                Some(inner) => format!("array[{}]", inner.type_desc()),
                None => "array[array]".to_string(),
            },
            a => format!("array[{}]", a.elem_type()),
        }
    }

    /// Bytes of the encoded array: element type (u32), count (u64), elements.
    pub fn encoded_len(&self) -> u64 {
        let body = match self {
            Array::String(v) => v.iter().map(|s| 8 + s.len() as u64).sum(),
            Array::Array(v) => v.iter().map(Array::encoded_len).sum(),
            a => a.len() as u64 * a.elem_type().fixed_size().unwrap_or(0) as u64,
        };
        12 + body
    }

    /// Integer elements converted to `T`; `None` when the array is not of an integer type,
    /// `Err(v)` naming the first element that does not fit.
    fn convert_ints<T: TryFrom<i128>>(&self) -> Option<Result<Vec<T>, i128>> {
        fn conv<S: Copy + Into<i128>, T: TryFrom<i128>>(v: &[S]) -> Result<Vec<T>, i128> {
            v.iter()
                .map(|&x| {
                    let w: i128 = x.into();
                    T::try_from(w).map_err(|_| w)
                })
                .collect()
        }
        Some(match self {
            Array::U8(v) => conv(v),
            Array::I8(v) => conv(v),
            Array::U16(v) => conv(v),
            Array::I16(v) => conv(v),
            Array::U32(v) => conv(v),
            Array::I32(v) => conv(v),
            Array::U64(v) => conv(v),
            Array::I64(v) => conv(v),
            _ => return None,
        })
    }
}

/// A Rust type that is one GGUF scalar value type, so `T` and `Vec<T>` convert into
/// [`Value`] and [`Array`] without naming the variant.
pub trait Element: Sized {
    fn into_value(self) -> Value;
    fn into_array(v: Vec<Self>) -> Array;
}

impl Element for u8 {
    fn into_value(self) -> Value {
        Value::U8(self)
    }
    fn into_array(v: Vec<Self>) -> Array {
        Array::U8(v)
    }
}
impl Element for i8 {
    fn into_value(self) -> Value {
        Value::I8(self)
    }
    fn into_array(v: Vec<Self>) -> Array {
        Array::I8(v)
    }
}
impl Element for u16 {
    fn into_value(self) -> Value {
        Value::U16(self)
    }
    fn into_array(v: Vec<Self>) -> Array {
        Array::U16(v)
    }
}
impl Element for i16 {
    fn into_value(self) -> Value {
        Value::I16(self)
    }
    fn into_array(v: Vec<Self>) -> Array {
        Array::I16(v)
    }
}
impl Element for u32 {
    fn into_value(self) -> Value {
        Value::U32(self)
    }
    fn into_array(v: Vec<Self>) -> Array {
        Array::U32(v)
    }
}
impl Element for i32 {
    fn into_value(self) -> Value {
        Value::I32(self)
    }
    fn into_array(v: Vec<Self>) -> Array {
        Array::I32(v)
    }
}
impl Element for f32 {
    fn into_value(self) -> Value {
        Value::F32(self)
    }
    fn into_array(v: Vec<Self>) -> Array {
        Array::F32(v)
    }
}
impl Element for bool {
    fn into_value(self) -> Value {
        Value::Bool(self)
    }
    fn into_array(v: Vec<Self>) -> Array {
        Array::Bool(v)
    }
}
impl Element for String {
    fn into_value(self) -> Value {
        Value::String(self)
    }
    fn into_array(v: Vec<Self>) -> Array {
        Array::String(v)
    }
}
impl Element for u64 {
    fn into_value(self) -> Value {
        Value::U64(self)
    }
    fn into_array(v: Vec<Self>) -> Array {
        Array::U64(v)
    }
}
impl Element for i64 {
    fn into_value(self) -> Value {
        Value::I64(self)
    }
    fn into_array(v: Vec<Self>) -> Array {
        Array::I64(v)
    }
}
impl Element for f64 {
    fn into_value(self) -> Value {
        Value::F64(self)
    }
    fn into_array(v: Vec<Self>) -> Array {
        Array::F64(v)
    }
}

impl<T: Element> From<T> for Value {
    fn from(x: T) -> Self {
        x.into_value()
    }
}
impl<T: Element> From<Vec<T>> for Array {
    fn from(v: Vec<T>) -> Self {
        T::into_array(v)
    }
}
impl<T: Element> From<Vec<T>> for Value {
    fn from(v: Vec<T>) -> Self {
        Value::Array(T::into_array(v))
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::String(s.to_string())
    }
}
impl From<Array> for Value {
    fn from(a: Array) -> Self {
        Value::Array(a)
    }
}
impl From<Vec<Array>> for Array {
    fn from(v: Vec<Array>) -> Self {
        Array::Array(v)
    }
}
impl From<Vec<&str>> for Value {
    fn from(v: Vec<&str>) -> Self {
        Value::Array(Array::String(v.into_iter().map(str::to_string).collect()))
    }
}

/// Metadata key → value, in file order, with O(1) lookup by key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a key; a key already present is an error (GGUF keys are unique).
    pub fn insert(
        &mut self,
        key: impl Into<String>,
        value: impl Into<Value>,
    ) -> Result<(), GgufError> {
        let key = key.into();
        if self.index.contains_key(&key) {
            return Err(GgufError::DuplicateKey(key));
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value.into()));
        Ok(())
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries in file order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn keys(&self) -> impl ExactSizeIterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    pub fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    fn get_int<T: TryFrom<i128>>(&self, key: &str, expected: &'static str) -> Result<T, GgufError> {
        let v = self.require(key)?;
        let i = v.as_int().ok_or_else(|| wrong_type(key, expected, v))?;
        T::try_from(i).map_err(|_| GgufError::OutOfRange {
            key: key.to_string(),
            value: i.to_string(),
            expected,
        })
    }

    /// Any integer type whose value fits in u32.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.get_int(key, "u32")
    }

    /// Any integer type whose value fits in u64.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.get_int(key, "u64")
    }

    /// Any integer type whose value fits in i32.
    pub fn get_i32(&self, key: &str) -> Result<i32, GgufError> {
        self.get_int(key, "i32")
    }

    /// Any integer type whose value fits in i64.
    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        self.get_int(key, "i64")
    }

    /// f32, or f64 rounded to the nearest f32.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        match self.require(key)? {
            Value::F32(x) => Ok(*x),
            Value::F64(x) => Ok(*x as f32),
            v => Err(wrong_type(key, "f32", v)),
        }
    }

    /// f64, or f32 widened.
    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        match self.require(key)? {
            Value::F32(x) => Ok(f64::from(*x)),
            Value::F64(x) => Ok(*x),
            v => Err(wrong_type(key, "f64", v)),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            Value::Bool(b) => Ok(*b),
            v => Err(wrong_type(key, "bool", v)),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            Value::String(s) => Ok(s),
            v => Err(wrong_type(key, "string", v)),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<&Array, GgufError> {
        match self.require(key)? {
            Value::Array(a) => Ok(a),
            v => Err(wrong_type(key, "array", v)),
        }
    }

    pub fn get_str_array(&self, key: &str) -> Result<&[String], GgufError> {
        match self.get_array(key)? {
            Array::String(v) => Ok(v),
            a => Err(wrong_array(key, "array[string]", a)),
        }
    }

    /// f32 array borrowed as stored, or an f64 array rounded.
    pub fn get_f32_array(&self, key: &str) -> Result<Cow<'_, [f32]>, GgufError> {
        match self.get_array(key)? {
            Array::F32(v) => Ok(Cow::Borrowed(v)),
            Array::F64(v) => Ok(Cow::Owned(v.iter().map(|&x| x as f32).collect())),
            a => Err(wrong_array(key, "array[f32]", a)),
        }
    }

    /// i32 array borrowed as stored, or any integer array whose elements all fit in i32.
    pub fn get_i32_array(&self, key: &str) -> Result<Cow<'_, [i32]>, GgufError> {
        match self.get_array(key)? {
            Array::I32(v) => Ok(Cow::Borrowed(v)),
            a => self.convert_array(key, a, "array[i32]").map(Cow::Owned),
        }
    }

    /// u32 array borrowed as stored, or any integer array whose elements all fit in u32.
    pub fn get_u32_array(&self, key: &str) -> Result<Cow<'_, [u32]>, GgufError> {
        match self.get_array(key)? {
            Array::U32(v) => Ok(Cow::Borrowed(v)),
            a => self.convert_array(key, a, "array[u32]").map(Cow::Owned),
        }
    }

    fn convert_array<T: TryFrom<i128>>(
        &self,
        key: &str,
        a: &Array,
        expected: &'static str,
    ) -> Result<Vec<T>, GgufError> {
        match a.convert_ints::<T>() {
            Some(Ok(v)) => Ok(v),
            Some(Err(bad)) => Err(GgufError::OutOfRange {
                key: key.to_string(),
                value: bad.to_string(),
                expected,
            }),
            None => Err(wrong_array(key, expected, a)),
        }
    }
}

fn wrong_type(key: &str, expected: &'static str, v: &Value) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected,
        found: v.type_desc(),
    }
}

fn wrong_array(key: &str, expected: &'static str, a: &Array) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected,
        found: a.type_desc(),
    }
}
