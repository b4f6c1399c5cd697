"""Operations of the spec whose areas are not built yet, one module per group of areas; each answers 501."""
