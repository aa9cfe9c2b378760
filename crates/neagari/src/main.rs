fn main() {
    println!("neagari");
}
