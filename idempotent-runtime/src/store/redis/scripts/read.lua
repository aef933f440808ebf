-- read. KEYS[1] the record. Returns {1, now[, the record's fields]}.
return answer(1, now_ms(), dump(KEYS[1]))
