"""opod's benchmarks: side-by-side measurements (direct, through opod, through peers) that print a table and save plots."""
