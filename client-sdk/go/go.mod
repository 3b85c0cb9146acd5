module palisade.local/palisade

go 1.19
