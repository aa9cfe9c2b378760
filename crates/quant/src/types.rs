//! ggml tensor type ids and their block geometry (ggml/include/ggml.h, ggml.c type_traits).

/// A ggml tensor type id as stored in GGUF tensor infos.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    Q1_0,
    Q2_0,
    /// PrismML fork only: Q2_0's codec at group 128.
    PQ2_0,
    /// PrismML fork only: TQ1_0's codec at group 128.
    PTQ1_0,
}

/// Geometry of one type: `block` weights are stored in `bytes` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypeInfo {
    pub name: &'static str,
    pub block: usize,
    pub bytes: usize,
}

impl GgmlType {
    pub fn from_id(id: u32) -> Option<Self> {
        use GgmlType::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            16 => IQ2_XXS,
            17 => IQ2_XS,
            18 => IQ3_XXS,
            19 => IQ1_S,
            20 => IQ4_NL,
            21 => IQ3_S,
            22 => IQ2_S,
            23 => IQ4_XS,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            29 => IQ1_M,
            30 => BF16,
            34 => TQ1_0,
            35 => TQ2_0,
            39 => MXFP4,
            41 => Q1_0,
            42 => Q2_0,
            142 => PQ2_0,
            143 => PTQ1_0,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        use GgmlType::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q8_1 => 9,
            Q2_K => 10,
            Q3_K => 11,
            Q4_K => 12,
            Q5_K => 13,
            Q6_K => 14,
            Q8_K => 15,
            IQ2_XXS => 16,
            IQ2_XS => 17,
            IQ3_XXS => 18,
            IQ1_S => 19,
            IQ4_NL => 20,
            IQ3_S => 21,
            IQ2_S => 22,
            IQ4_XS => 23,
            I8 => 24,
            I16 => 25,
            I32 => 26,
            I64 => 27,
            F64 => 28,
            IQ1_M => 29,
            BF16 => 30,
            TQ1_0 => 34,
            TQ2_0 => 35,
            MXFP4 => 39,
            Q1_0 => 41,
            Q2_0 => 42,
            PQ2_0 => 142,
            PTQ1_0 => 143,
        }
    }

    pub fn info(self) -> TypeInfo {
        use GgmlType::*;
        let (name, block, bytes) = match self {
            F32 => ("F32", 1, 4),
            F16 => ("F16", 1, 2),
            Q4_0 => ("Q4_0", 32, 18),
            Q4_1 => ("Q4_1", 32, 20),
            Q5_0 => ("Q5_0", 32, 22),
            Q5_1 => ("Q5_1", 32, 24),
            Q8_0 => ("Q8_0", 32, 34),
            Q8_1 => ("Q8_1", 32, 36),
            Q2_K => ("Q2_K", 256, 84),
            Q3_K => ("Q3_K", 256, 110),
            Q4_K => ("Q4_K", 256, 144),
            Q5_K => ("Q5_K", 256, 176),
            Q6_K => ("Q6_K", 256, 210),
            Q8_K => ("Q8_K", 256, 292),
            IQ2_XXS => ("IQ2_XXS", 256, 66),
            IQ2_XS => ("IQ2_XS", 256, 74),
            IQ3_XXS => ("IQ3_XXS", 256, 98),
            IQ1_S => ("IQ1_S", 256, 50),
            IQ4_NL => ("IQ4_NL", 32, 18),
            IQ3_S => ("IQ3_S", 256, 110),
            IQ2_S => ("IQ2_S", 256, 82),
            IQ4_XS => ("IQ4_XS", 256, 136),
            I8 => ("I8", 1, 1),
            I16 => ("I16", 1, 2),
            I32 => ("I32", 1, 4),
            I64 => ("I64", 1, 8),
            F64 => ("F64", 1, 8),
            IQ1_M => ("IQ1_M", 256, 56),
            BF16 => ("BF16", 1, 2),
            TQ1_0 => ("TQ1_0", 256, 54),
            TQ2_0 => ("TQ2_0", 256, 66),
            MXFP4 => ("MXFP4", 32, 17),
            Q1_0 => ("Q1_0", 128, 18),
            Q2_0 => ("Q2_0", 64, 18),
            PQ2_0 => ("PQ2_0", 128, 34),
            PTQ1_0 => ("PTQ1_0", 128, 28),
        };
        TypeInfo { name, block, bytes }
    }

    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// Bytes of a row of `n` elements, or `None` when `n` is not a whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        let i = self.info();
        if !n.is_multiple_of(i.block) {
            return None;
        }
        (n / i.block).checked_mul(i.bytes)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn ids_round_trip() {
        for id in 0..256 {
            if let Some(t) = GgmlType::from_id(id) {
                assert_eq!(t.id(), id);
            }
        }
    }
}
