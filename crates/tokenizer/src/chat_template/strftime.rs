//! `strftime_now(format)` for chat templates: Python's `datetime.now().strftime(format)` on a
//! naive date-time (so `%Z` and `%z` print nothing), in UTC.
//!
//! Directives follow glibc's `strftime` in the C locale (what CPython calls on Linux), with
//! glibc's `-` flag (no padding); an unknown directive is copied through as written.

/// A broken-down UTC date-time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DateTime {
    pub year: i64,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub micros: u32,
    /// 0 = Sunday
    pub weekday: u32,
    /// 1..=366
    pub yday: u32,
}

const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

impl DateTime {
    /// The UTC date-time `micros_since_epoch` microseconds after 1970-01-01T00:00:00Z.
    pub fn from_unix_micros(micros_since_epoch: i64) -> Self {
        let secs = micros_since_epoch.div_euclid(1_000_000);
        let micros = micros_since_epoch.rem_euclid(1_000_000) as u32;
        let days = secs.div_euclid(86_400);
        let tod = secs.rem_euclid(86_400);
        // Proleptic Gregorian civil date from a day count (Hinnant's days_from_civil inverse).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
        const CUM: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let yday = CUM[(month - 1) as usize] + day + u32::from(leap && month > 2);
        DateTime {
            year,
            month,
            day,
            hour: (tod / 3600) as u32,
            minute: (tod % 3600 / 60) as u32,
            second: (tod % 60) as u32,
            micros,
            // 1970-01-01 was a Thursday.
            weekday: (days + 4).rem_euclid(7) as u32,
            yday,
        }
    }

    pub fn strftime(&self, fmt: &str) -> String {
        let mut out = String::new();
        let mut chars = fmt.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let no_pad = chars.peek() == Some(&'-');
            if no_pad {
                chars.next();
            }
            let Some(d) = chars.next() else {
                out.push('%');
                if no_pad {
                    out.push('-');
                }
                break;
            };
            let num = |v: i64, width: usize, pad: char| -> String {
                if no_pad {
                    v.to_string()
                } else if pad == '0' {
                    format!("{v:0width$}")
                } else {
                    format!("{v:>width$}")
                }
            };
            let hour12 = match self.hour % 12 {
                0 => 12,
                h => h,
            };
            let s = match d {
                'a' => WEEKDAYS[self.weekday as usize][..3].to_string(),
                'A' => WEEKDAYS[self.weekday as usize].to_string(),
                'b' | 'h' => MONTHS[(self.month - 1) as usize][..3].to_string(),
                'B' => MONTHS[(self.month - 1) as usize].to_string(),
                'c' => self.strftime("%a %b %e %H:%M:%S %Y"),
                'C' => num(self.year.div_euclid(100), 2, '0'),
                'd' => num(self.day.into(), 2, '0'),
                'D' => self.strftime("%m/%d/%y"),
                'e' => num(self.day.into(), 2, ' '),
                'f' => format!("{:06}", self.micros),
                'F' => self.strftime("%Y-%m-%d"),
                'H' => num(self.hour.into(), 2, '0'),
                'I' => num(hour12.into(), 2, '0'),
                'j' => num(self.yday.into(), 3, '0'),
                'k' => num(self.hour.into(), 2, ' '),
                'l' => num(hour12.into(), 2, ' '),
                'm' => num(self.month.into(), 2, '0'),
                'M' => num(self.minute.into(), 2, '0'),
                'n' => "\n".to_string(),
                'p' => if self.hour < 12 { "AM" } else { "PM" }.to_string(),
                'P' => if self.hour < 12 { "am" } else { "pm" }.to_string(),
                'r' => self.strftime("%I:%M:%S %p"),
                'R' => self.strftime("%H:%M"),
                'S' => num(self.second.into(), 2, '0'),
                't' => "\t".to_string(),
                'T' => self.strftime("%H:%M:%S"),
                'u' => (if self.weekday == 0 { 7 } else { self.weekday }).to_string(),
                'w' => self.weekday.to_string(),
                'x' => self.strftime("%m/%d/%y"),
                'X' => self.strftime("%H:%M:%S"),
                'y' => num(self.year.rem_euclid(100), 2, '0'),
                'Y' => self.year.to_string(),
                // A naive datetime has no zone: Python prints nothing.
                'z' | 'Z' => String::new(),
                '%' => "%".to_string(),
                other => {
                    let mut s = String::from('%');
                    if no_pad {
                        s.push('-');
                    }
                    s.push(other);
                    s
                }
            };
            out.push_str(&s);
        }
        out
    }
}
