module cfnet.local/podbin

go 1.24
