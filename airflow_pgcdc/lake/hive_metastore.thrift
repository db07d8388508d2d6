// The part of the Hive Metastore's Thrift interface (Apache Hive 4.0.1,
// hive_metastore.thrift, Apache License 2.0) that airflow_pgcdc/lake/catalog.py calls:
// the types and methods as the metastore's own classes define them, rebuilt from its jar.
// get_table is not here: Hive 4 removed it (get_table_req replaces it).
namespace java org.apache.hadoop.hive.metastore.api

enum PrincipalType {
  USER = 1,
  ROLE = 2,
  GROUP = 3,
}

enum DatabaseType {
  NATIVE = 1,
  REMOTE = 2,
}

struct FieldSchema {
  1: string name,
  2: string type,
  3: string comment,
}

struct SerDeInfo {
  1: string name,
  2: string serializationLib,
  3: map<string, string> parameters,
  4: optional string description,
  5: optional string serializerClass,
  6: optional string deserializerClass,
}

struct Order {
  1: string col,
  2: i32 order,
}

struct SkewedInfo {
  1: list<string> skewedColNames,
  2: list<list<string>> skewedColValues,
  3: map<list<string>, string> skewedColValueLocationMaps,
}

struct StorageDescriptor {
  1: list<FieldSchema> cols,
  2: string location,
  3: string inputFormat,
  4: string outputFormat,
  5: bool compressed,
  6: i32 numBuckets,
  7: SerDeInfo serdeInfo,
  8: list<string> bucketCols,
  9: list<Order> sortCols,
  10: map<string, string> parameters,
  11: optional SkewedInfo skewedInfo,
  12: optional bool storedAsSubDirectories,
}

struct Table {
  1: string tableName,
  2: string dbName,
  3: string owner,
  4: i32 createTime,
  5: i32 lastAccessTime,
  6: i32 retention,
  7: StorageDescriptor sd,
  8: list<FieldSchema> partitionKeys,
  9: map<string, string> parameters,
  10: string viewOriginalText,
  11: string viewExpandedText,
  12: string tableType,
  14: optional bool temporary,
  15: optional bool rewriteEnabled,
  17: optional string catName,
  18: optional PrincipalType ownerType = 1,
  19: optional i64 writeId = -1,
  20: optional bool isStatsCompliant,
  22: optional byte accessType,
  23: optional list<string> requiredReadCapabilities,
  24: optional list<string> requiredWriteCapabilities,
  25: optional i64 id,
  28: optional i64 txnId,
}

struct Database {
  1: string name,
  2: string description,
  3: string locationUri,
  4: map<string, string> parameters,
  6: optional string ownerName,
  7: optional PrincipalType ownerType,
  8: optional string catalogName,
  9: optional i32 createTime,
  10: optional string managedLocationUri,
  11: optional DatabaseType type,
  12: optional string connector_name,
  13: optional string remote_dbname,
}

struct EnvironmentContext {
  1: map<string, string> properties,
}

struct GetTableRequest {
  1: required string dbName,
  2: required string tblName,
  4: optional string catName,
  6: optional string validWriteIdList,
  7: optional bool getColumnStats,
  8: optional list<string> processorCapabilities,
  9: optional string processorIdentifier,
  10: optional string engine = "hive",
  11: optional i64 id = -1,
}

struct GetTableResult {
  1: required Table table,
  2: optional bool isStatsCompliant,
}

struct GetTablesRequest {
  1: required string dbName,
  2: optional list<string> tblNames,
  4: optional string catName,
  5: optional list<string> processorCapabilities,
  6: optional string processorIdentifier,
  8: optional string tablesPattern,
}

struct GetTablesResult {
  1: required list<Table> tables,
}

exception MetaException {
  1: string message,
}

exception NoSuchObjectException {
  1: string message,
}

exception AlreadyExistsException {
  1: string message,
}

exception InvalidObjectException {
  1: string message,
}

exception InvalidOperationException {
  1: string message,
}

exception UnknownDBException {
  1: string message,
}

service ThriftHiveMetastore {
  void alter_table(1: string dbname, 2: string tbl_name, 3: Table new_tbl) throws (1: InvalidOperationException o1, 2: MetaException o2),
  void alter_table_with_environment_context(1: string dbname, 2: string tbl_name, 3: Table new_tbl, 4: EnvironmentContext environment_context) throws (1: InvalidOperationException o1, 2: MetaException o2),
  void create_database(1: Database database) throws (1: AlreadyExistsException o1, 2: InvalidObjectException o2, 3: MetaException o3),
  void create_table(1: Table tbl) throws (1: AlreadyExistsException o1, 2: InvalidObjectException o2, 3: MetaException o3, 4: NoSuchObjectException o4),
  void create_table_with_environment_context(1: Table tbl, 2: EnvironmentContext environment_context) throws (1: AlreadyExistsException o1, 2: InvalidObjectException o2, 3: MetaException o3, 4: NoSuchObjectException o4),
  void drop_database(1: string name, 2: bool deleteData, 3: bool cascade) throws (1: NoSuchObjectException o1, 2: InvalidOperationException o2, 3: MetaException o3),
  void drop_table(1: string dbname, 2: string name, 3: bool deleteData) throws (1: NoSuchObjectException o1, 2: MetaException o3),
  void drop_table_with_environment_context(1: string dbname, 2: string name, 3: bool deleteData, 4: EnvironmentContext environment_context) throws (1: NoSuchObjectException o1, 2: MetaException o3),
  list<string> get_all_databases() throws (1: MetaException o1),
  list<string> get_all_tables(1: string db_name) throws (1: MetaException o1),
  Database get_database(1: string name) throws (1: NoSuchObjectException o1, 2: MetaException o2),
  GetTablesResult get_table_objects_by_name_req(1: GetTablesRequest req) throws (1: MetaException o1, 2: InvalidOperationException o2, 3: UnknownDBException o3),
  GetTableResult get_table_req(1: GetTableRequest req) throws (1: MetaException o1, 2: NoSuchObjectException o2),
  list<string> get_tables(1: string db_name, 2: string pattern) throws (1: MetaException o1),
  string getVersion(),
}
